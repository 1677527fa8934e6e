package wire

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// RefusalTable renders Kinds as docs/protocol.md's table of refusals: the
// local API's statuses (kinds an exec stream carries only have none).
func refusalTable() string {
	var b strings.Builder
	b.WriteString("| status | code | meaning | vm-exec exit |\n| --- | --- | --- | --- |\n")
	for _, k := range Kinds {
		status := "—"
		if k.Status != 0 {
			status = fmt.Sprint(k.Status)
		}
		fmt.Fprintf(&b, "| %s | `%s` | %s | %d |\n", status, k.Code, k.Meaning, k.Exit)
	}
	return b.String()
}

// exitTable renders ExitCodes as docs/protocol.md's table of exit codes.
func exitTable() string {
	var b strings.Builder
	b.WriteString("| code | meaning |\n|---|---|\n")
	for _, c := range ExitCodes {
		fmt.Fprintf(&b, "| %d | %s |\n", c.Code, c.Meaning)
	}
	return b.String()
}

// TestProtocolDocTables: docs/protocol.md's tables of refusals and exit
// codes are the ones in this package, so the docs cannot drift from what
// the daemon and the clients do.
func TestProtocolDocTables(t *testing.T) {
	b, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for name, table := range map[string]string{"refusals": refusalTable(), "exit codes": exitTable()} {
		if !strings.Contains(doc, table) {
			t.Errorf("docs/protocol.md lacks the %s table as wire has it; it should read:\n%s", name, table)
		}
	}
}

// TestKinds: each kind is one row, with a meaning; every code maps to one
// exit code whatever its status; the exit codes are above the guest's
// range and documented.
func TestKinds(t *testing.T) {
	exit := map[string]int{}
	for _, k := range Kinds {
		if k.Name == "" || k.Code == "" || k.Meaning == "" {
			t.Errorf("kind %+v is incomplete", *k)
		}
		if e, ok := exit[k.Code]; ok && e != k.Exit {
			t.Errorf("code %s: exit %d and %d", k.Code, e, k.Exit)
		}
		exit[k.Code] = k.Exit
		if (Error{Code: k.Code}).ExitCode() != k.Exit {
			t.Errorf("code %s: ExitCode disagrees with the table", k.Code)
		}
	}
	documented := map[int]bool{}
	for _, c := range ExitCodes {
		documented[c.Code] = true
	}
	for _, e := range exit {
		if !documented[e] {
			t.Errorf("exit code %d is not in ExitCodes", e)
		}
	}
}

func TestExitStatus(t *testing.T) {
	for _, c := range []struct {
		r    Result
		want int
	}{
		{Result{ExitCode: 3}, 3},
		{Result{ExitCode: -1, Signal: "KILL"}, 137},
		{Result{ExitCode: -1, Signal: "KILL", TimedOut: true}, ExitTimedOut},
		{Result{ExitCode: 0, TimedOut: true}, ExitTimedOut},
	} {
		if got := c.r.ExitStatus(); got != c.want {
			t.Errorf("%+v: %d, want %d", c.r, got, c.want)
		}
	}
}
