package gateway

import (
	"context"
	"log/slog"
	"net"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/sshfront"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// sshCore is the exec core as the SSH front door sees it (sshfront.Core).
type sshCore struct{ s *Server }

func (c sshCore) Policy() *policy.Policy       { return c.s.policy.Load() }
func (c sshCore) Audit(rec audit.Record) error { return c.s.audit.Write(rec) }

func (c sshCore) ListenUnix(path string) (net.Listener, error) {
	return listenUnix(path, c.s.cfg.SocketMode, c.s.cfg.SocketGroup, c.s.log)
}

// Exec runs an SSH request through admit and runExec, as handleExec does
// an HTTP one. The command ends when the client goes away (r.Gone) or the
// shutdown grace period is over.
func (c sshCore) Exec(ctx context.Context, log *slog.Logger, r sshfront.Request) sshfront.Outcome {
	s := c.s
	if !s.begin() {
		return sshfront.Outcome{Refused: &wire.Error{Code: wire.CodeShutdown, Error: "vmgated is shutting down"}}
	}
	defer s.end()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.execCtx, cancel)()
	go func() {
		select {
		case <-r.Gone:
			cancel() // the client closed the channel or the connection dropped
		case <-ctx.Done():
		}
	}()
	st := newExecState(r.ID, r.Exec, r.Interactive)
	log = log.With("req", st.reqID)
	target, rerr := s.admit(ctx, log, st)
	if rerr != nil {
		w := rerr.Wire()
		return sshfront.Outcome{RequestID: st.reqID, Refused: &w}
	}
	if r.Admitted != nil {
		r.Admitted(st.verdict.Limits)
	}
	var resize chan vm.PTY
	if r.Resize != nil {
		resize = make(chan vm.PTY, 1)
		go func() {
			for {
				select {
				case t := <-r.Resize:
					select {
					case resize <- vm.PTY{Columns: t.Cols, Rows: t.Rows}:
					case <-ctx.Done():
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	res, err := s.runExec(ctx, log, st, target, execIO{stdin: r.Stdin, stdout: r.Stdout, stderr: r.Stderr,
		signals: r.Signals, resize: resize, gone: r.Gone})
	return sshfront.Outcome{RequestID: st.reqID, Limits: st.verdict.Limits, Result: res, Err: err, Stopping: err != nil && s.execCtx.Err() != nil}
}
