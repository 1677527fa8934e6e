package attempts

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestTableNamesAndDocs(t *testing.T) {
	names := Names()
	if len(names) < 30 {
		t.Fatalf("only %d attempts, want at least 30", len(names))
	}
	seen := map[string]bool{}
	for _, a := range All() {
		if a.Name == "" || strings.TrimSpace(a.Name) != a.Name || strings.ContainsAny(a.Name, " \t\n") {
			t.Errorf("bad attempt name %q", a.Name)
		}
		if seen[a.Name] {
			t.Errorf("duplicate attempt name %q", a.Name)
		}
		seen[a.Name] = true
		if strings.TrimSpace(a.Doc) == "" {
			t.Errorf("attempt %q has no doc line", a.Name)
		}
		if strings.Contains(a.Doc, "\n") {
			t.Errorf("attempt %q: doc is not one line", a.Name)
		}
		if a.Control && a.Informational {
			t.Errorf("attempt %q is both a control and informational", a.Name)
		}
		got, ok := Lookup(a.Name)
		if !ok || !reflect.DeepEqual(got, a) {
			t.Errorf("Lookup(%q) = %+v, %v", a.Name, got, ok)
		}
	}
	if len(seen) != len(names) {
		t.Errorf("Names() has %d entries, All() %d distinct", len(names), len(seen))
	}
	ctl, ok := Lookup("write-own-vm-dir")
	if !ok || !ctl.Control {
		t.Errorf("write-own-vm-dir must be a control: %+v, %v", ctl, ok)
	}
	if _, ok := Lookup("no-such-attempt"); ok {
		t.Error("Lookup found a name that is not in the table")
	}
}

func TestAllReturnsCopy(t *testing.T) {
	a := All()
	a[0].Name = "mutated"
	if All()[0].Name == "mutated" {
		t.Fatal("All exposes the table itself")
	}
}

func TestDecodeAndJudge(t *testing.T) {
	const in = `{"results":[
		{"name":"read-etc-shadow","blocked":true,"detail":"open /etc/shadow: no such file or directory"},
		{"name":"write-own-vm-dir","blocked":false,"control":true,"detail":"created and removed"},
		{"name":"exec-self","blocked":false,"detail":"ran"},
		{"name":"mount-tmpfs","blocked":false,"detail":"mount: succeeded"},
		{"name":"open-dev-kvm","blocked":false,"skipped":true,"detail":"skipped: --no-kvm not given"}
	]}`
	rep, err := Decode(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 5 {
		t.Fatalf("decoded %d results", len(rep.Results))
	}
	res, ok := rep.Get("write-own-vm-dir")
	if !ok || !res.Control || res.Blocked {
		t.Errorf("Get(write-own-vm-dir) = %+v, %v", res, ok)
	}
	fails := rep.Failures()
	if len(fails) != 1 || fails[0].Name != "mount-tmpfs" {
		t.Errorf("Failures() = %+v, want only mount-tmpfs (exec-self is informational, kvm skipped)", fails)
	}
	if sk := rep.Skipped(); len(sk) != 1 || sk[0].Name != "open-dev-kvm" {
		t.Errorf("Skipped() = %+v", sk)
	}

	// A blocked control is a failure too.
	rep.Results[1].Blocked = true
	if fails := rep.Failures(); len(fails) != 2 {
		t.Errorf("Failures() with a blocked control = %+v", fails)
	}

	// Round trip through JSON keeps everything, and omits empty flags.
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(rep); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), `"name":"read-etc-shadow","blocked":true,"control"`) {
		t.Errorf("control=false is not omitted: %s", buf.String())
	}
	back, err := Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, rep) {
		t.Errorf("round trip: got %+v, want %+v", back, rep)
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, in := range []string{
		`not json`,
		`{"results":[{"blocked":true}]}`,
		`{"results":[{"name":"x","surprise":1}]}`,
	} {
		if _, err := Decode(strings.NewReader(in)); err == nil {
			t.Errorf("Decode(%s) succeeded", in)
		}
	}
}

func TestTable(t *testing.T) {
	rep := Report{Results: []Result{
		{Name: "read-etc-shadow", Blocked: true, Detail: "open /etc/shadow: no such file or directory (ENOENT)"},
		{Name: "write-own-vm-dir", Control: true, Detail: "created"},
		{Name: "write-own-vm-dir", Control: true, Blocked: true, Detail: "EROFS"},
		{Name: "mount-tmpfs", Detail: "mount: succeeded"},
		{Name: "open-dev-kvm", Skipped: true, Detail: "skipped"},
	}}
	out := Table(rep)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if len(lines) != 6 {
		t.Fatalf("table has %d lines, want header + 5:\n%s", len(lines), out)
	}
	for i, want := range []string{"verdict", "blocked", "control-ok", "CONTROL-FAIL", "NOT-BLOCKED", "skipped"} {
		if !strings.Contains(lines[i], want) {
			t.Errorf("line %d %q lacks %q", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[1], "(ENOENT)") {
		t.Errorf("detail missing from %q", lines[1])
	}
	// Columns line up: every verdict starts at the same offset.
	col := strings.Index(lines[1], "blocked")
	if strings.Index(lines[4], "NOT-BLOCKED") != col {
		t.Errorf("columns do not line up:\n%s", out)
	}
}

func TestSorted(t *testing.T) {
	rep := Report{Results: []Result{{Name: "b"}, {Name: "a"}}}
	if got := rep.Sorted(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("Sorted() = %v", got)
	}
}
