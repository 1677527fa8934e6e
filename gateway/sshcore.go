package gateway

import (
	"context"
	"log/slog"
	"net"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/sshfront"
	"github.com/vmgate/vmgate/policy"
)

// doorCore is what every front door gets of the daemon: the policy in
// force, the audit log, and Unix sockets made as the daemon's own.
type doorCore struct{ s *Server }

func (c doorCore) Policy() *policy.Policy       { return c.s.pol.Load() }
func (c doorCore) Audit(rec audit.Record) error { return c.s.rec.Write(rec) }

func (c doorCore) ListenUnix(path string) (net.Listener, error) {
	return listenUnix(path, c.s.cfg.SocketMode, c.s.cfg.SocketGroup, c.s.log)
}

// sshCore is the exec core as the SSH front door sees it (sshfront.Core).
type sshCore struct{ doorCore }

// Exec takes an SSH request through the core's one entry, admit, and runs
// it, as handleExec does an HTTP one. A login the front door cannot serve
// (r.Refused) is refused there, audited as a denial.
func (c sshCore) Exec(ctx context.Context, log *slog.Logger, r sshfront.Request) sshfront.Outcome {
	s := c.s
	st := newExecState(r.ID, r.Exec, r.Interactive)
	st.refused = r.Refused
	log = log.With("req", st.reqID)
	a, rerr := s.admit(ctx, log, st)
	if rerr != nil {
		w := rerr.Wire()
		return sshfront.Outcome{RequestID: st.reqID, Refused: &w}
	}
	if r.Admitted != nil {
		r.Admitted(a.Limits())
	}
	res, err := a.Run(ctx, execIO{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr,
		signals: r.Signals, resize: r.Resize, gone: r.Gone})
	return sshfront.Outcome{RequestID: st.reqID, Limits: a.Limits(), Result: res, Err: err, Stopping: err != nil && s.flight.over()}
}
