package gateway

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// TestMayRotateAudit: who may move the audit log aside. Before, an
// admin = true profile could, although admin means seeing everyone's
// status (issue 30, finding 5).
func TestMayRotateAudit(t *testing.T) {
	p, err := policy.Parse("rotate.toml", []byte(`
version = 1

[[profile]]
name = "auditors"
match = { groups = ["audit"] }
audit_rotate = true

[[profile]]
name = "admins"
match = { groups = ["wheel"], ssh = true }
admin = true

[[profile]]
name = "everyone"
match = { any = true }
`))
	if err != nil {
		t.Fatal(err)
	}
	const daemon = 991
	for _, c := range []struct {
		name string
		id   policy.Identity
		want bool
	}{
		{"root", policy.Identity{UID: 0}, true},
		{"the daemon's user", policy.Identity{UID: daemon}, true},
		{"audit_rotate profile", policy.Identity{UID: 1002, Groups: []string{"audit"}}, true},
		{"admin profile", policy.Identity{UID: 1000, Groups: []string{"wheel"}}, false},
		{"anyone else", policy.Identity{UID: 1001}, false},
		{"an SSH key of an admin profile", policy.Identity{SSH: &policy.SSHKey{Profile: "admins"}}, false},
	} {
		if got := mayRotateAudit(p, c.id, daemon); got != c.want {
			t.Errorf("%s: mayRotateAudit = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestStatusRedactsArgv: a running command's argv in the status (vm-exec
// ps, which shows admins everyone's commands) is redacted as the audit
// log records it (--audit-redact), by the audit log's own redaction, for
// an argv and for a shell string alike.
func TestStatusRedactsArgv(t *testing.T) {
	al, err := audit.Open(audit.Options{Path: filepath.Join(t.TempDir(), "audit.jsonl"), Redact: []string{`^--password=`, `(?i)token`}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	s := &Server{rec: &recorder{Log: al}, live: newLiveExecs()}
	for _, tc := range []struct {
		req  wire.ExecRequest
		want []string
	}{
		{wire.ExecRequest{Argv: []string{"mysql", "--password=hunter2", "-u", "root"}}, []string{"mysql", audit.Redacted, "-u", "root"}},
		{wire.ExecRequest{Argv: []string{"curl -H 'Authorization: TOKEN abc' x"}, Shell: true}, []string{"sh", "-c", audit.Redacted}},
		{wire.ExecRequest{Argv: []string{"ls", "-l"}}, []string{"ls", "-l"}},
	} {
		st := newExecState(policy.Identity{UID: 1000}, &tc.req, false)
		untrack := s.track(st, &vmTarget{vm: &vm.VM{ID: "v1"}})
		got := s.live.m[st.reqID].info.Argv
		untrack()
		if !slices.Equal(got, tc.want) {
			t.Errorf("argv %q: the status shows %q, want %q", tc.req.Argv, got, tc.want)
		}
		if !slices.Equal(al.RedactArgv(st.argv), tc.want) {
			t.Errorf("argv %q: the audit log's redaction differs from the status's", tc.req.Argv)
		}
	}
}
