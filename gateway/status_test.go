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
	s := &Server{audit: al, live: map[string]liveExec{}}
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
		got := s.live[st.reqID].info.Argv
		untrack()
		if !slices.Equal(got, tc.want) {
			t.Errorf("argv %q: the status shows %q, want %q", tc.req.Argv, got, tc.want)
		}
		if !slices.Equal(al.RedactArgv(st.argv), tc.want) {
			t.Errorf("argv %q: the audit log's redaction differs from the status's", tc.req.Argv)
		}
	}
}
