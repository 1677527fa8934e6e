package gateway

// The exec core: a request that a front door (the local API in api.go;
// the SSH front door, package sshfront, through sshcore.go) has parsed
// goes admit (a lease, the audit check, the policy decision, audited) →
// acquire (a fresh VM: pool, restore or boot; or the caller's session's,
// from the sessions) → runExec (the command, with the front door's
// streams) → audit. It knows no transport: refusals are *RequestError,
// outcomes wire.Result, and each front door maps them to its own terms.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// admit is the one entry into the exec core: every front door (the HTTP
// API, SSH) hands it a command parsed into st, and it takes it through
// the core's steps up to a command ready to run: a lease (shutdown waits
// for it; once shutdown began it is refused with ErrShutdown), the audit
// check, the policy decision (audited), and its VM: a fresh one, or the
// caller's session's. A refusal is returned as such, audited when a
// decision was made; busy and session errors come back before any
// output, so that a front door can still answer plainly. ctx bounds
// queueing and booting: it ends when the client goes away, and the lease
// ends it when the shutdown grace period is over.
//
// Postcondition: on success the caller calls Run or Abort of the
// admitted request, once.
func (s *Server) admit(ctx context.Context, log *slog.Logger, st *execState) (*admitted, *RequestError) {
	l, rerr := s.enter(ctx)
	if rerr != nil {
		rerr.RequestID = st.reqID
		return nil, rerr
	}
	target, rerr := s.decide(l.ctx, log, st)
	if rerr != nil {
		l.end()
		return nil, rerr
	}
	return &admitted{s: s, lease: l, log: log, st: st, target: target}, nil
}

// decide takes an admitted request from the audit check through the
// policy decision (audited) to its VM.
func (s *Server) decide(ctx context.Context, log *slog.Logger, st *execState) (*vmTarget, *RequestError) {
	unaudited := func(err error) *RequestError {
		return &RequestError{Kind: ErrAuditUnavailable, Msg: "refusing to run unaudited: " + err.Error(), RequestID: st.reqID}
	}
	if err := s.rec.Healthy(); err != nil {
		log.Error("refusing request: audit log unavailable", "err", err)
		return nil, unaudited(err)
	}
	st.policy = s.pol.Load()
	if st.refused != nil {
		st.verdict = policy.Verdict{Rule: "front door", Reason: st.refused.Error()}
		if k := st.id.SSH; k != nil {
			st.verdict.Profile = k.Profile
		}
	} else {
		if st.req.Session != "" {
			key := sessionKey{st.id.Key(), st.req.Session}
			st.netLock = s.sessions.netLockOf(key)
			st.image, st.imageSrc = s.sessions.imageOf(key)
			if st.req.Image != "" && st.req.Image != st.image {
				st.imageSrc = nil // refused later: checkImage
			}
			st.heldSecrets = s.sessions.secretsOf(key)
		}
		if st.imageSrc == nil { // not a session's that knows its own
			st.imageSrc = s.host.ImageSourceOf(s.imageOfRequest(st))
		}
		src := st.imageSrc
		st.imageUser = src.CommandUser()
		if st.interactive && len(st.argv) == 0 {
			// A login shell the front door left to the image: bash, or
			// sh in a root without bash.
			st.argv = src.LoginShell()
		}
		if st.req.Shell && st.req.Login {
			st.argv = src.LoginCommand(st.req.Argv[0])
		}
		st.verdict = st.policy.Decide(st.id, st.policyRequest())
	}
	if err := s.rec.decision(&st.request, st.decisionRecord()); err != nil {
		return nil, unaudited(err)
	}
	if !st.verdict.Allowed {
		log.Info("denied", "profile", st.verdict.Profile, "rule", st.verdict.Rule, "reason", st.verdict.Reason)
		return nil, &RequestError{Kind: ErrDenied, Msg: st.verdict.Reason, Profile: st.verdict.Profile, Rule: st.verdict.Rule, RequestID: st.reqID,
			Receipt: s.signReceipt(st, execOutcome{})}
	}
	st.env, st.dir = st.imageSrc.CommandEnv(st.verdict.Env), st.imageSrc.CommandDir(st.req.Dir)
	target, err := s.acquireVM(ctx, st)
	if err != nil {
		s.auditExec(st, execOutcome{err: err})
		re := requestError(err, &st.request)
		re.Receipt = s.signReceipt(st, execOutcome{err: err})
		return nil, re
	}
	st.env = append(st.env, secretEnv(target.kit(), st.verdict.Secrets)...)
	return target, nil
}

// imageOfRequest is the image st is decided in: the one it names, its
// session's, or its caller's profile's ("" when no profile takes it).
// The policy checks it; this only finds the configuration to decide with.
func (s *Server) imageOfRequest(st *execState) string {
	if img := cmp.Or(st.req.Image, st.image); img != "" {
		return img
	}
	g, _ := st.policy.GrantOf(st.id)
	return g.Image
}

// admitted is a request the exec core took in (admit): decided, audited,
// its VM acquired, its lease held. Its front door runs it (Run) or gives
// it up (Abort), once.
type admitted struct {
	s      *Server
	lease  *lease
	log    *slog.Logger
	st     *execState
	target *vmTarget
}

// RequestID is the request's id.
func (a *admitted) RequestID() string { return a.st.reqID }

// Limits are the limits the policy gave the request.
func (a *admitted) Limits() policy.Limits { return a.st.verdict.Limits }

// Run runs the command with the front door's streams, releases its VM (a
// fresh one is destroyed, a session's kept unless it died), audits the
// outcome and returns the result. The command ends when ctx ends, when
// the client goes away (sio.gone) or when the shutdown grace period is
// over; a non-nil error means its outcome is unknown.
func (a *admitted) Run(ctx context.Context, sio execIO) (wire.Result, error) {
	defer a.lease.end()
	ctx, cancel := a.lease.g.within(ctx)
	defer cancel()
	if sio.gone != nil {
		go func() {
			select {
			case <-sio.gone:
				cancel() // the client closed its stream or the connection dropped
			case <-ctx.Done():
			}
		}()
	}
	return a.s.runExec(ctx, a.log, a.st, a.target, sio)
}

// Detach starts the command as a background process of its session
// (procs.go) instead of running it with a front door's streams, and
// releases its share of the session; its decision was audited, its end
// will be. A start that failed is audited now.
func (a *admitted) Detach(ctx context.Context) (wire.Proc, *RequestError) {
	defer a.lease.end()
	ctx, cancel := a.lease.g.within(ctx)
	defer cancel()
	p, err := a.s.sessions.startProc(ctx, a.st, a.target)
	a.s.release(a.target, !a.target.vm.Gone())
	if err != nil {
		a.s.auditExec(a.st, execOutcome{target: a.target, err: err})
		return wire.Proc{}, requestError(err, &a.st.request)
	}
	return p, nil
}

// Abort gives the request up before its command ran: its VM is released
// as one not fit for use.
func (a *admitted) Abort() {
	defer a.lease.end()
	a.s.release(a.target, false)
}

// vmTarget is the VM an exec runs in: fresh (destroyed afterwards) or a
// session's (kept).
type vmTarget struct {
	vm      *vm.VM
	jail    string // the confinement of its QEMU, read from /proc while it runs
	boot    time.Duration
	start   string // boot, restore or pool
	queue   time.Duration
	session *session // nil: a fresh VM
	slot    func()   // a fresh VM's slot, freed with it
	// secrets are a fresh VM's secrets (a session keeps its own).
	secrets *secretKit
}

// kit is what t's VM holds of its secrets.
func (t *vmTarget) kit() *secretKit {
	if t.session != nil {
		return t.session.kit()
	}
	return t.secrets
}

func (s *Server) acquireVM(ctx context.Context, st *execState) (*vmTarget, error) {
	if st.req.Session != "" {
		return s.sessions.vmFor(ctx, st)
	}
	return s.boot(ctx, st)
}

// release ends a request's use of its VM. A session's is given back to
// the sessions. A fresh VM is destroyed after the result is sent, not
// before: the caller need not wait for QEMU to exit and its files to go.
// Its slot stays taken until then, and shutdown waits for it (a lease). A
// fresh VM not fit for use (ok false: it failed, or its request's stream
// broke) is destroyed first, so that an error reaches a caller with the
// VM's disk space (what a full disk needs back) and slot already freed; a
// failed VM's QEMU is gone, so that costs only its files.
func (s *Server) release(t *vmTarget, ok bool) {
	if t.session != nil {
		s.sessions.release(t, ok)
		return
	}
	destroy := func() {
		if err := t.vm.Close(); err != nil {
			s.log.Error("destroy vm", "vm", t.vm.ID, "err", err)
		}
		t.slot()
	}
	if ok {
		if l, rerr := s.enter(context.Background()); rerr == nil {
			go func() {
				defer l.end()
				destroy()
			}()
			return
		}
	}
	destroy()
}

// boot takes a VM slot (waiting in the bounded queue) and boots a fresh
// VM shaped by the verdict; the target holds the slot. If the client goes
// away while queued or booting, ctx ends and vm.Start cleans up.
func (s *Server) boot(ctx context.Context, st *execState) (*vmTarget, error) {
	v := st.verdict
	t0 := time.Now()
	release, err := s.slots.acquire(ctx, claim(&st.request))
	if err != nil {
		s.metrics.refusedBusy()
		return nil, &RequestError{Kind: ErrBusy, Msg: fmt.Sprintf("%v (the daemon runs at most %d VMs; profile %q: max_vms = %d, max_vms_per_caller = %d)", err, s.cfg.MaxVMs, v.Profile, v.Limits.MaxVMs, v.Limits.CallerVMs)}
	}
	queue := time.Since(t0)
	t1 := time.Now()
	m, how, err := s.host.Get(ctx, s.shape(v))
	if err != nil {
		release()
		s.log.Warn("start vm failed", "req", st.reqID, "err", vm.Details(err))
		return nil, &RequestError{Kind: ErrVMFailed, Msg: "start vm: " + clientMessage(err)}
	}
	t := &vmTarget{vm: m, start: how, jail: jailOf(m), boot: time.Since(t1), queue: queue, slot: release}
	// Every VM with a NIC starts with a network that allows nothing; it
	// gets the profile's allowlist, audited as this request's, only now
	// that it is this request's VM, with the secrets the request asked
	// for (their CA installed in the guest first).
	if n := v.Network; n != nil {
		err := func() error {
			k, _, err := armKit(ctx, t.vm, nil, v.Secrets, t.vm.ID)
			if err != nil {
				return err
			}
			t.secrets = k
			pol, err := netPolicy(n, s.rec.netHook(&st.request, t.vm.ID), k, v.Secrets)
			if err == nil {
				t.vm.Network().SetPolicy(pol)
			}
			return err
		}()
		if err != nil {
			s.log.Warn("start vm failed", "req", st.reqID, "err", err)
			if cerr := t.vm.Close(); cerr != nil {
				s.log.Error("destroy vm", "vm", t.vm.ID, "err", cerr)
			}
			release()
			return nil, &RequestError{Kind: ErrVMFailed, Msg: "start vm: " + err.Error()}
		}
	}
	return t, nil
}

// jailOf describes the confinement of m's QEMU process.
func jailOf(m *vm.VM) string {
	rep, err := m.JailReport()
	if err != nil {
		return "unavailable: " + err.Error()
	}
	return rep.String()
}

// execIO is a front door's side of a running command.
type execIO struct {
	stdin          io.Reader // nil: empty stdin
	stdout, stderr io.Writer
	// signals carries RFC 4254 signal names to the command.
	signals <-chan string
	// resize carries new terminal sizes of a TTY command (Cols, Rows).
	resize <-chan wire.TTY
	// gone is closed when the client went away.
	gone <-chan struct{}
	// files carries the request's file transfers; nil for a front door
	// without them (SSH).
	files *transferIO
}

// ptySizes passes a front door's terminal sizes on as the VM's, until ctx
// ends; nil when there are none.
func ptySizes(ctx context.Context, in <-chan wire.TTY) <-chan vm.PTY {
	if in == nil {
		return nil
	}
	out := make(chan vm.PTY, 1)
	go func() {
		for {
			select {
			case t := <-in:
				select {
				case out <- vm.PTY{Columns: t.Cols, Rows: t.Rows}:
				case <-ctx.Done():
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// runExec runs st's admitted command in target with the front door's
// streams, releases target (a fresh VM is destroyed, a session's kept
// unless it died), audits the outcome and returns the result. A non-nil
// error means the outcome is unknown: the VM failed, the client went
// away or the grace period after shutdown ended.
//
// Precondition: target came from admit; ctx ends when the client goes
// away or s.execCtx ends.
func (s *Server) runExec(ctx context.Context, log *slog.Logger, st *execState, target *vmTarget, sio execIO) (wire.Result, error) {
	// The streams as relayed: counted and hashed for the audit record
	// and the receipt.
	stdinSeen := &receipt.Hasher{}
	var stdin io.Reader
	if sio.stdin != nil {
		stdin = io.TeeReader(sio.stdin, stdinSeen)
	}
	stdout := &receipt.Hasher{W: sio.stdout}
	stderr := &receipt.Hasher{W: sio.stderr}
	var pty *vm.PTY
	if t := st.req.TTY; t != nil {
		pty = &vm.PTY{Term: t.Term, Columns: t.Cols, Rows: t.Rows}
	}
	untrack := s.track(st, target)
	defer untrack()
	t0 := time.Now()
	var transfers []wire.Transfer
	putErr := s.transfersRun(ctx, st, target, sio.files, true, &transfers)
	var res *vm.ExecResult
	var err error
	if putErr == nil && !st.req.TransferOnly() {
		res, err = target.vm.Exec(ctx, vm.ExecRequest{PTY: pty,
			Argv: st.argv, Env: st.env, Dir: st.dir, User: st.verdict.User,
			Stdin: stdin, Stdout: stdout, Stderr: stderr,
			Timeout: st.verdict.Limits.Timeout, OutputLimit: st.verdict.Limits.OutputLimit, Signals: sio.signals,
			Resize: ptySizes(ctx, sio.resize),
		})
	}
	execDur := time.Since(t0)
	if res != nil {
		s.metrics.exec(target.start, execDur)
	}
	// A VM whose QEMU is gone, or whose agent was given up (and the VM
	// killed), cannot serve a session's next command.
	vmOK := !errors.Is(err, vm.ErrVMDied) && !errors.Is(err, vm.ErrAgentUnresponsive) && !target.vm.Gone()
	if putErr == nil && err == nil && vmOK {
		err = s.transfersRun(ctx, st, target, sio.files, false, &transfers)
		vmOK = !target.vm.Gone()
	}
	if putErr != nil {
		err = putErr
	}
	select {
	case <-sio.gone:
		err = cancelledByClient(err)
	default:
	}
	// The VM's disk as the command left it, read before a fresh VM's files go.
	diskBytes := target.vm.DiskBytes()
	s.release(target, vmOK) // a session whose VM died is ended; a fresh VM always goes
	if target.session == nil {
		s.rec.flushNet(target.vm.ID)
	}
	o := execOutcome{res: res, target: target, err: err, stdin: stdinSeen.Stream(), execDur: execDur,
		stdout: stdout.Stream(), stderr: stderr.Stream(), transfers: transfers, diskBytes: diskBytes}
	s.auditExec(st, o)
	out := result(st, o)
	out.Receipt = s.signReceipt(st, o)
	if err != nil {
		log.Warn("exec failed", "err", vm.Details(err))
		return out, err
	}
	log.Info("exec done", "vm", target.vm.ID, "exit", out.ExitCode, "signal", out.Signal, "timed_out", out.TimedOut, "transfers", len(transfers), "ms", out.TotalMS)
	return out, nil
}
