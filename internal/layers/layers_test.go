package layers

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

func TestFloor(t *testing.T) {
	for rel, want := range map[string]string{
		"internal/names": "leaves", "internal/transfer": "leaves", "policy/netrule": "leaves",
		"guest/agentproto": "leaves", "policy": "policy and jail", "isolate/seccomp": "policy and jail",
		"guest/agent": "guest", "guest/agentconn": "guest", "vm": "host VM", "vm/netstack": "host VM",
		"gateway": "daemon", "gateway/client/shelltool": "daemon", "cmd/vmgated/cli": "commands",
	} {
		if _, got, ok := Floor(rel); !ok || got != want {
			t.Errorf("Floor(%s) = %q, %v; want %q", rel, got, ok, want)
		}
	}
	if _, _, ok := Floor("vmx"); ok {
		t.Error("vmx is on a floor")
	}
}

// TestCheck: an import up a floor, and a package on no floor, are
// reported; imports down or across one floor are not.
func TestCheck(t *testing.T) {
	m := func(rel string) string { return Module + "/" + rel }
	got := Check(map[string][]string{
		m("policy"):      {m("internal/names"), m("gateway/wire"), "strings"},
		m("guest/agent"): {m("vm"), m("guest/agentproto")},
		m("gateway"):     {m("vm"), m("policy"), m("gateway/audit")},
		m("newthing"):    nil,
	})
	want := []string{
		"guest/agent (guest) imports vm (host VM): an import up a floor",
		"newthing stands on no floor (add it to package layers)",
		"policy (policy and jail) imports gateway/wire (daemon): an import up a floor",
	}
	if !slices.Equal(got, want) {
		t.Errorf("Check:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestModuleLayers holds the module's own imports to the floors.
func TestModuleLayers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports", Module+"/...")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	imports := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		imports[p.ImportPath] = p.Imports
	}
	if len(imports) < 30 {
		t.Fatalf("go list found %d packages", len(imports))
	}
	for _, v := range Check(imports) {
		t.Error(v)
	}
	for _, v := range Folders(imports) {
		t.Error(v)
	}
}

// TestFolders: two folders that import each other are reported, by one
// import each way; one-way imports and imports inside a folder are not.
func TestFolders(t *testing.T) {
	m := func(rel string) string { return Module + "/" + rel }
	got := Folders(map[string][]string{
		m("internal/netwire"): {m("policy/netrule"), m("internal/names"), "strings"},
		m("policy"):           {m("internal/names")},
		m("gateway"):          {m("vm"), m("policy")},
		m("vm"):               {m("internal/names"), m("vm/netstack")},
	})
	want := []string{"folders internal and policy import each other (internal/netwire imports policy/netrule; policy imports internal/names)"}
	if !slices.Equal(got, want) {
		t.Errorf("Folders:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestAgentLinksNoHostCode: the guest agent's binary links the guest side,
// the protocol and the leaves only, never the host's VM layer or the
// daemon (two opposite trust models).
func TestAgentLinksNoHostCode(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const agent = Module + "/cmd/vmgate-agent"
	out, err := exec.Command("go", "list", "-deps", agent).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	guest, _, _ := Floor("guest")
	n := 0
	for _, d := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(d, Module+"/")
		if !ok || d == agent {
			continue
		}
		n++
		if f, name, ok := Floor(rel); !ok || f > guest {
			t.Errorf("the guest agent links %s (%s)", rel, name)
		}
	}
	if n == 0 {
		t.Fatal("go list found none of the module's packages in the agent")
	}
}
