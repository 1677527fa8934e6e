package gateway

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// sessionFileV1 is the session file's format version 1 as the daemon
// wrote it from a mirror struct, before the record was the session's own
// half: the reference the record must read and write.
type sessionFileV1 struct {
	Version  int                 `json:"version"`
	Owner    string              `json:"owner"`
	Name     string              `json:"name"`
	Caller   policy.Identity     `json:"caller"`
	Profile  string              `json:"profile"`
	Created  time.Time           `json:"created"`
	Idle     time.Duration       `json:"idle_ns"`
	Max      time.Duration       `json:"max_ns"`
	Paused   policy.PausedLimits `json:"paused_limits"`
	Shape    vm.Shape            `json:"shape"`
	Parent   string              `json:"parent,omitempty"`
	State    string              `json:"state"`
	Save     string              `json:"save_point,omitempty"`
	PausedAt time.Time           `json:"paused_at,omitzero"`
	NetLock  *policy.NetLimit    `json:"net_lock,omitempty"`
}

// TestSessionRecordFormat: a session file of version 1 reads as the
// record, and the record writes version 1, byte for byte, so that paused
// sessions survive an upgrade and a downgrade. The session's image is its
// shape's: a file written before images could be chosen names its
// profile's image of then there.
func TestSessionRecordFormat(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for _, old := range []sessionFileV1{
		{Version: 1, Owner: "uid:1000", Name: "work", Caller: policy.Identity{UID: 1000, GID: 1000, User: "alice", Groups: []string{"dev"}},
			Profile: "agent", Created: at, Idle: 10 * time.Minute, Max: time.Hour, Paused: policy.PausedLimits{After: 5 * time.Minute, MaxCount: 4, MaxBytes: 1 << 30},
			Shape: vm.Shape{Image: "py", MemoryMiB: 512, CPUs: 1, DiskMiB: 2048, Seccomp: "required", Network: true}, Parent: "base",
			State: "paused", Save: "sp-0123abcd", PausedAt: at.Add(30 * time.Minute), NetLock: &policy.NetLimit{Allow: []string{"example.com:443"}}},
		{Version: 1, Owner: "ssh:SHA256:abc", Name: "s", Caller: policy.Identity{SSH: &policy.SSHKey{Fingerprint: "SHA256:abc", Profile: "agent"}},
			Profile: "agent", Created: at, State: "running"},
	} {
		v1, err := json.MarshalIndent(old, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		var rec sessionRecord
		dec := json.NewDecoder(strings.NewReader(string(v1)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			t.Fatalf("a version 1 file does not read: %v\n%s", err, v1)
		}
		if rec.key() != (sessionKey{old.Owner, old.Name}) || string(rec.State) != old.State || rec.Caller.Key() != rec.Owner {
			t.Errorf("read as %+v", rec)
		}
		if got, want := (&session{sessionRecord: rec}).image(), cmp.Or(old.Shape.Image, vm.DefaultImage); got != want {
			t.Errorf("the session's image is %q, want %q", got, want)
		}
		b, err := json.MarshalIndent(rec, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != string(v1) {
			t.Errorf("the record writes\n%s\nversion 1 is\n%s", b, v1)
		}
	}
}

// TestRegisterNameTaken: a session (a fork's copy, or a new session)
// whose name another request took meanwhile is refused as session busy,
// naming the session, and leaves no file behind; it never reaches the
// caller as a failed VM.
func TestRegisterNameTaken(t *testing.T) {
	x := &sessions{log: slog.New(slog.DiscardHandler), stateDir: t.TempDir(), table: map[sessionKey]*session{}}
	key := sessionKey{"uid:1000", "copy"}
	x.table[key] = newSession(newSessionRecord(key, policy.Identity{UID: 1000}, policy.Verdict{}, vm.Shape{}, time.Now()))
	c := newSession(newSessionRecord(key, policy.Identity{UID: 1000}, policy.Verdict{}, vm.Shape{}, time.Now()))
	err := x.register(c, &request{reqID: "r1"}, "created: a fork of work", audit.Record{})
	var rerr *RequestError
	if !errors.As(err, &rerr) || rerr.Kind != ErrSessionBusy || !strings.Contains(rerr.Msg, `session "copy"`) {
		t.Fatalf("register of a taken name: %v", err)
	}
	if _, err := os.Stat(x.dir(c.sid)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused session's directory is left: %v", err)
	}
	// A fork's copies that fail so are reported as session busy too.
	got := forkFailure("work", errors.Join(errors.New("restore: qemu died"), err))
	if got.Kind != ErrSessionBusy || !strings.Contains(got.Msg, `session "copy"`) || !strings.Contains(got.Msg, "no copy was made") {
		t.Errorf("fork failure with a taken name: %v %q", got.Kind, got.Msg)
	}
	if got := forkFailure("work", errors.New("restore: qemu died")); got.Kind != ErrVMFailed {
		t.Errorf("fork failure of a VM: %v %q", got.Kind, got.Msg)
	}
}

// TestServerStaysSmall: the daemon's big types stay small: Server has at
// most 50 methods and a session at most 16 fields. A type past that is a
// sign that a feature wants a home of its own (shared/STYLE.md, item 31).
func TestServerStaysSmall(t *testing.T) {
	fset := token.NewFileSet()
	files, _ := filepath.Glob("*.go")
	methods, fields := 0, -1
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.FuncDecl:
				if n.Recv != nil && len(n.Recv.List) == 1 {
					if st, ok := n.Recv.List[0].Type.(*ast.StarExpr); ok && fmt.Sprint(st.X) == "Server" {
						methods++
					}
				}
			case *ast.TypeSpec:
				if st, ok := n.Type.(*ast.StructType); ok && n.Name.Name == "session" {
					fields = 0
					for _, fl := range st.Fields.List {
						fields += max(1, len(fl.Names))
					}
				}
			}
			return true
		})
	}
	if methods == 0 || methods > 50 {
		t.Errorf("Server has %d methods, want 1 to 50", methods)
	}
	if fields < 1 || fields > 16 {
		t.Errorf("session has %d fields, want 1 to 16", fields)
	}
}
