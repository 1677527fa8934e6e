package gateway_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
)

// TestGateway_AuditRotation rotates the daemon's audit log as logrotate
// does (move, then SIGHUP's reload) and as vmgated audit rotate does, and
// verifies the series: one chain across three files. A reload onto a
// broken policy keeps the old one, and status says why.
func TestGateway_AuditRotation(t *testing.T) {
	d := gatewaytest.Start(t, testPolicy, nil)
	denied := func() {
		t.Helper()
		// Denied requests write decision records and boot nothing.
		if _, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"rm", "-rf", "/"}}, nil); !errors.Is(err, client.ErrDenied) {
			t.Fatalf("rm: %v", err)
		}
	}
	denied()
	if err := os.Rename(d.AuditPath, d.AuditPath+".1"); err != nil {
		t.Fatal(err)
	}
	d.Reload()
	denied()
	ctx := context.Background()
	out, err := d.Client.RotateAudit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	moved := out.RotatedTo
	denied()

	if err := os.WriteFile(d.Config.PolicyPath, []byte("version = 1\n[[profile]]\nname = 'x'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Reload()
	st, err := d.Client.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.PolicyError == "" || st.AuditSeq == 0 || st.AuditHead == "" {
		t.Errorf("status after a failed reload: policy_error %q, audit %d %s", st.PolicyError, st.AuditSeq, st.AuditHead)
	}
	denied() // the old policy still decides
	d.StopAndCheck(t)

	reps, err := audit.VerifyFiles(d.AuditPath+".1", moved, d.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 3 || reps[1].ContinuesSeq != reps[0].LastSeq || reps[2].ContinuesSeq != reps[1].LastSeq {
		t.Errorf("reports %+v", reps)
	}
	if _, err := audit.VerifyFiles(d.AuditPath+".1", d.AuditPath); err == nil {
		t.Error("a missing middle file went unnoticed")
	}
}
