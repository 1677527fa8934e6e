package gateway

// Background processes of sessions (vm-exec --session S --detach; the
// socket API's /v1/sessions/{name}/procs). The guest agent keeps them,
// with their output, in the guest's memory (its process table), so that
// a pause, a resume, a fork and a daemon's restart carry them: the daemon
// keeps nothing of a process but the note that its end is still to be
// audited (sessionRecord.Procs), and watches each one's end while its
// session runs. A process is started as a command is decided and audited
// (the decision record), and is one more record when it ends: its exit,
// its output's bytes and its duration.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/vm"
)

// pendingProc is a background process whose end is still to be audited,
// as its session's record keeps it.
type pendingProc struct {
	Handle  int64     `json:"handle"`
	Request string    `json:"request_id"`
	Argv    []string  `json:"argv"`
	Shell   bool      `json:"shell,omitempty"`
	User    string    `json:"user"`
	Started time.Time `json:"started"`
}

// procWatchWait is how long one watch call waits for a process's end.
const procWatchWait = 60 * time.Second

// startProc starts st's command as a background process of its session
// in target (a share of the session, which it gives back), and returns
// the process. Its end is watched and audited from now on.
func (x *sessions) startProc(ctx context.Context, st *execState, target *vmTarget) (wire.Proc, error) {
	ss, v := target.session, target.vm
	lim := st.verdict.Limits
	info, err := v.ProcStart(ctx, vm.ProcStartRequest{
		Spec:      vm.ExecSpec{Argv: st.argv, Env: st.env, Dir: st.dir, User: st.verdict.User},
		TimeoutMS: lim.Timeout.Milliseconds(), BufferBytes: lim.ProcessBuffer, Stdin: st.req.Stdin, MaxProcs: lim.MaxProcesses,
	})
	if err != nil {
		if has, herr := v.Has(ctx, vm.FeatureProcs); herr == nil && !has {
			err = errAgentTooOld
		}
		return wire.Proc{}, opError(err, ss.Name, st.reqID)
	}
	p := pendingProc{Handle: info.Handle, Request: st.reqID, Argv: st.argv, Shell: st.req.Shell, User: st.verdict.User, Started: time.Unix(0, info.Started)}
	ss.mu.Lock()
	ss.Procs = append(ss.Procs, p)
	ss.mu.Unlock()
	if err := x.store(ss, nil); err != nil {
		x.log.Warn("a background process's note not saved: its end is audited only while vmgated runs", "session", ss.Name, "handle", p.Handle, "err", err)
	}
	x.watchProc(ss, v, p)
	x.log.Info("background process started", "session", ss.Name, "handle", info.Handle, "pid", info.PID, "req", st.reqID)
	return procOf(*info), nil
}

// errAgentTooOld is a VM whose guest agent predates what a request needs.
var errAgentTooOld = errors.New("the image's agent predates background processes, users and file operations: rebuild the image (vmgated image build, or image import)")

// watchProc watches p in ss's VM v, once per VM: its end is audited and
// forgotten. A watch ends without a record when the VM goes (a pause, the
// session's end): a resume watches again, an end audits what is left.
func (x *sessions) watchProc(ss *session, v *vm.VM, p pendingProc) {
	ss.mu.Lock()
	if ss.watching == nil {
		ss.watching = map[int64]*vm.VM{}
	}
	if ss.watching[p.Handle] == v || ss.State == stateEnded {
		ss.mu.Unlock()
		return
	}
	ss.watching[p.Handle] = v
	ss.mu.Unlock()
	go func() {
		defer func() {
			ss.mu.Lock()
			if ss.watching[p.Handle] == v {
				delete(ss.watching, p.Handle)
			}
			ss.mu.Unlock()
		}()
		for {
			out, err := v.ProcLogs(context.Background(), vm.ProcLogsRequest{Handle: p.Handle, WaitMS: procWatchWait.Milliseconds()})
			if err != nil {
				if errors.Is(err, vm.ErrNoProcess) {
					x.procEnded(ss, v, p, nil, "the guest agent no longer has it (its agent restarted, or its table forgot it)")
				}
				return
			}
			if out.Info.State == vm.ProcExited {
				x.procEnded(ss, v, p, &out.Info, "")
				return
			}
		}
	}()
}

// watchAll watches every process of ss whose end is still to be
// audited, in its VM v (a resume, a fork's copy).
func (x *sessions) watchAll(ss *session, v *vm.VM) {
	ss.mu.Lock()
	procs := append([]pendingProc(nil), ss.Procs...)
	ss.mu.Unlock()
	for _, p := range procs {
		x.watchProc(ss, v, p)
	}
}

// procEnded audits the end of p (info nil: unknown, why says so), and
// forgets it.
func (x *sessions) procEnded(ss *session, v *vm.VM, p pendingProc, info *vm.ProcInfo, why string) {
	ss.mu.Lock()
	kept := ss.Procs[:0]
	found := false
	for _, q := range ss.Procs {
		if q.Handle == p.Handle && q.Request == p.Request {
			found = true
			continue
		}
		kept = append(kept, q)
	}
	ss.Procs = kept
	ss.mu.Unlock()
	if !found {
		return // audited already
	}
	rec := audit.Record{Kind: audit.KindExec, RequestID: p.Request, Session: ss.Name, Profile: ss.Profile, Argv: p.Argv, Shell: p.Shell,
		GuestUser: p.User, Process: p.Handle, DurationMS: time.Since(p.Started).Milliseconds(), Message: "background process ended", Error: why}
	if v != nil {
		rec.VMID = v.ID
	}
	if info != nil {
		if e := info.Exit; e != nil {
			code := int(e.Status)
			if e.Signal != "" {
				code = 0
				rec.Signal = e.Signal
			}
			rec.ExitCode = &code
		}
		rec.TimedOut, rec.StdoutBytes, rec.StderrBytes = info.TimedOut, info.Out, info.Err
		rec.Truncated = info.OutDropped+info.ErrDropped > 0
		if info.Ended > 0 {
			rec.DurationMS = time.Unix(0, info.Ended).Sub(time.Unix(0, info.Started)).Milliseconds()
		}
	}
	setCaller(&rec, ss.Caller)
	if err := x.rec.Write(rec); err != nil {
		x.log.Error("audit a background process's end", "session", ss.Name, "handle", p.Handle, "err", err)
	}
	if err := x.store(ss, nil); err != nil && !errors.Is(err, errSessionClosed) {
		x.log.Warn("a background process's end not saved", "session", ss.Name, "handle", p.Handle, "err", err)
	}
}

// endProcs audits the end of every process of ss still running when ss
// ends (they end with its VM).
func (x *sessions) endProcs(ss *session, why string) {
	ss.mu.Lock()
	procs := append([]pendingProc(nil), ss.Procs...)
	ss.mu.Unlock()
	for _, p := range procs {
		x.procEnded(ss, nil, p, nil, "killed with its session: "+why)
	}
}

// opError is the error of an operation in a session's guest (on a
// background process, on a file) as the caller is told: the guest's
// refusals by their kind, anything else as the VM's failure.
func opError(err error, session, reqID string) *RequestError {
	re := &RequestError{Kind: ErrBadRequest, Msg: fmt.Sprintf("session %q: %v", session, err), RequestID: reqID}
	switch {
	case errors.Is(err, vm.ErrNoProcess):
		re.Kind = wire.KindNotFound
	case errors.Is(err, vm.ErrProcLimit):
		re.Kind, re.Rule = ErrSessionBusy, "sessions.max_processes"
		re.Msg = fmt.Sprintf("session %q runs the most background processes its profile allows (sessions.max_processes): %v", session, err)
	case errors.Is(err, vm.ErrProcBusy):
		re.Kind = ErrSessionBusy
	case errors.Is(err, vm.ErrProcEnded):
	case errors.Is(err, errAgentTooOld):
		re.Kind, re.Msg = ErrVMFailed, err.Error()
	default:
		for kind, fe := range fileErrors {
			if errors.Is(err, kind) {
				re.FileError = fe
				if kind == vm.ErrFileNotFound {
					re.Kind = wire.KindNotFound
				}
				return re
			}
		}
		if errors.Is(err, vm.ErrFSFailed) {
			return re
		}
		re = requestError(err, nil)
		re.RequestID = reqID
	}
	return re
}

// fileErrors names the guest's refusals of file operations.
var fileErrors = map[error]string{
	vm.ErrFileNotFound: wire.FileNotFound, vm.ErrFileExists: wire.FileExists, vm.ErrPermission: wire.FileDenied,
	vm.ErrNotDir: wire.FileNotDir, vm.ErrIsDir: wire.FileIsDir, vm.ErrTooBig: wire.FileTooBig,
}

// procOf is a process as the wire carries it.
func procOf(i vm.ProcInfo) wire.Proc {
	p := wire.Proc{Handle: i.Handle, PID: i.PID, Argv: i.Argv, User: i.User, Dir: i.Dir, State: i.State, TimedOut: i.TimedOut,
		Started: time.Unix(0, i.Started).UTC(), StdoutBytes: i.Out, StderrBytes: i.Err, StdoutDropped: i.OutDropped, StderrDropped: i.ErrDropped,
		Next: i.Next, StdinOpen: i.StdinOpen}
	if i.Ended > 0 {
		p.Ended = time.Unix(0, i.Ended).UTC()
	}
	if e := i.Exit; e != nil {
		if e.Signal != "" {
			p.Signal = e.Signal
		} else {
			code := int(e.Status)
			p.ExitCode = &code
		}
	}
	if p.Argv == nil {
		p.Argv = []string{}
	}
	return p
}

// outputOf is a page of a process's output as the wire carries it.
func outputOf(o vm.ProcOutput) wire.ProcOutput {
	out := wire.ProcOutput{Chunks: make([]wire.ProcChunk, 0, len(o.Chunks)), Next: o.Next, Dropped: o.Dropped, Proc: procOf(o.Info)}
	for _, c := range o.Chunks {
		stream := wire.StreamStdout
		if c.Stream == vm.StreamStderr {
			stream = wire.StreamStderr
		}
		out.Chunks = append(out.Chunks, wire.ProcChunk{Stream: stream, Offset: c.Offset, Data: c.Data})
	}
	return out
}
