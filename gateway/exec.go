package gateway

// The exec core: a request that a front door (the local API in api.go;
// the SSH front door, package sshfront, through sshcore.go) has parsed
// goes admit (audit check, policy decision, audited) → acquire (a fresh
// VM: pool, restore or boot; or the caller's session's) → runExec (the
// command, with the front door's streams) → audit. It knows no transport: refusals are *RequestError,
// outcomes wire.Result, and each front door maps them to its own terms.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

// newRequestID returns a fresh request id for the audit log and the caller.
func newRequestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// execState collects what the audit record of one exec needs.
type execState struct {
	reqID string
	id    policy.Identity
	argv  []string
	req   *wire.ExecRequest
	// interactive marks a login shell on a terminal (SSH without a
	// command); argv is then the shell.
	interactive bool
	// refused is a front door's own refusal of the request (an SSH login
	// it cannot serve): the core audits it as a denial, without a policy
	// decision.
	refused error
	verdict policy.Verdict
	start   time.Time
	// For its receipt (receipts.go): the policy that decided, where its
	// last audit record went (nil: none of its own, auditNote says why),
	// and what its guest did on the network.
	policy    *policy.Policy
	recorded  *audit.Entry
	auditNote string
	net       netSummary
	// netLock is the session's network lock the decision saw: the
	// command runs only if the session has the same when it gets it.
	netLock *policy.NetLimit
}

// newExecState starts the record of a request from id. The argv decided
// on is req.Argv, or ["sh", "-c", STRING] for a shell string.
func newExecState(id policy.Identity, req *wire.ExecRequest, interactive bool) *execState {
	st := &execState{reqID: newRequestID(), id: id, req: req, argv: req.Argv, interactive: interactive, start: time.Now()}
	if req.Shell && len(req.Argv) == 1 {
		st.argv = []string{"sh", "-c", req.Argv[0]}
	}
	return st
}

// setCaller fills in rec's caller fields from id: the SO_PEERCRED identity
// of a local caller, or the key of an SSH one.
func setCaller(rec *audit.Record, id policy.Identity) {
	if k := id.SSH; k != nil {
		rec.SSH = &audit.SSHClient{Fingerprint: k.Fingerprint, Comment: k.Comment, User: k.User, Remote: k.RemoteAddr}
		return
	}
	uid, gid := id.UID, id.GID
	rec.UID, rec.GID, rec.PID, rec.User = &uid, &gid, id.PID, id.User
}

func (s *Server) auditDecision(st *execState) error {
	v := audit.VerdictDeny
	if st.verdict.Allowed {
		v = audit.VerdictAllow
	}
	rec := audit.Record{
		Kind: audit.KindDecision, RequestID: st.reqID,
		Profile: st.verdict.Profile, Argv: st.argv, Shell: st.req.Shell, Session: st.req.Session,
		Verdict: v, Rule: st.verdict.Rule, Reason: st.verdict.Reason,
	}
	setCaller(&rec, st.id)
	rec.EnvNames, rec.Dir, rec.TTY = envNames(st.req.Env), st.req.Dir, st.req.TTY != nil
	rec.Transfers = auditTransfers(st.req, nil)
	rec.Network = auditNetwork(st.verdict)
	if st.interactive {
		rec.Message = "interactive shell"
	}
	s.metrics.request(st.verdict.Profile, string(v))
	if !st.verdict.Allowed {
		e, err := s.auditGated(s.denyGate, st.id.Key(), rec)
		if e == nil && err == nil {
			st.auditNote = "the denial was held back by the audit flood gate and counted in a summary record"
		}
		st.recorded = e
		return err
	}
	return s.audit.Write(rec)
}

// envNames returns the names of KEY=VALUE entries: the audit records
// which variables a request set, never their values.
func envNames(env []string) []string {
	var out []string
	for _, e := range env {
		name, _, _ := strings.Cut(e, "=")
		out = append(out, name)
	}
	return out
}

// admit is the one entry into the exec core: every front door (the HTTP
// API, SSH) hands it a request parsed into st, and it takes it through
// the core's steps up to a command ready to run: registered in flight
// (shutdown waits for it; once shutdown began it is refused with
// ErrShutdown), the audit check, the policy decision (audited), and its
// VM: a fresh one, or the caller's session's. A refusal is returned as
// such, audited when a decision was made; busy and session errors come
// back before any output, so that a front door can still answer plainly.
// ctx bounds queueing and booting: it ends when the client goes away, and
// admit ends it when the shutdown grace period is over.
//
// Postcondition: on success the caller calls Run or Abort of the
// admitted request, once.
func (s *Server) admit(ctx context.Context, log *slog.Logger, st *execState) (*admitted, *RequestError) {
	if !s.begin() {
		return nil, &RequestError{Kind: ErrShutdown, Msg: ErrShutdown.Error(), RequestID: st.reqID}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.execCtx, cancel)()
	target, rerr := s.decide(ctx, log, st)
	if rerr != nil {
		s.end()
		return nil, rerr
	}
	return &admitted{s: s, log: log, st: st, target: target}, nil
}

// sessionDecider decides a request on session ss itself.
type sessionDecider func(p *policy.Policy, st *execState, ss *session) policy.Verdict

// decideSession decides a pause, or a fork into newNames. Its verdict
// gives no network: the session keeps its own (a fork's copies, their
// parent's), and its decision record claims none.
func decideSession(newNames ...string) sessionDecider {
	return func(p *policy.Policy, st *execState, _ *session) policy.Verdict {
		v := p.DecideSession(st.id, newNames...)
		v.Network = nil
		return v
	}
}

// onSession is the exec core's entry for a request on a session itself
// (pause, fork, network lock), as admit is for a command: counted in
// flight (refused with ErrShutdown once shutdown began), the policy
// decision of the session request (decide; audited, through the deny
// flood gate), then op as the session's owner, after a command that runs
// in it (waited for as long as a VM slot is). ctx ends when the client
// goes away or the shutdown grace period is over.
func (s *Server) onSession(ctx context.Context, id policy.Identity, ss *session, decide sessionDecider, op func(context.Context, *session, *execState) error) *RequestError {
	st := newExecState(id, &wire.ExecRequest{Session: ss.key.name}, false)
	if !s.begin() {
		return &RequestError{Kind: ErrShutdown, Msg: ErrShutdown.Error(), RequestID: st.reqID}
	}
	defer s.end()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.execCtx, cancel)()
	st.policy = s.policy.Load()
	st.verdict = decide(st.policy, st, ss)
	if err := s.auditDecision(st); err != nil {
		return &RequestError{Kind: ErrAuditUnavailable, Msg: "refusing to run unaudited: " + err.Error(), RequestID: st.reqID}
	}
	if !st.verdict.Allowed {
		return &RequestError{Kind: ErrDenied, Msg: st.verdict.Reason, Profile: st.verdict.Profile, Rule: st.verdict.Rule, RequestID: st.reqID}
	}
	if err := ss.take(ctx, s.cfg.QueueWait); err != nil {
		if errors.Is(err, errSessionEnded) {
			return &RequestError{Kind: wire.KindNotFound, Msg: fmt.Sprintf("session %q ended", ss.key.name), RequestID: st.reqID}
		}
		return requestError(err, st)
	}
	defer ss.give()
	if err := op(ctx, ss, st); err != nil {
		return requestError(err, st)
	}
	return nil
}

// decide takes an admitted request from the audit check through the
// policy decision (audited) to its VM.
func (s *Server) decide(ctx context.Context, log *slog.Logger, st *execState) (*vmTarget, *RequestError) {
	unaudited := func(err error) *RequestError {
		return &RequestError{Kind: ErrAuditUnavailable, Msg: "refusing to run unaudited: " + err.Error(), RequestID: st.reqID}
	}
	if err := s.audit.Healthy(); err != nil {
		log.Error("refusing request: audit log unavailable", "err", err)
		return nil, unaudited(err)
	}
	st.policy = s.policy.Load()
	if st.refused != nil {
		st.verdict = policy.Verdict{Rule: "front door", Reason: st.refused.Error()}
		if k := st.id.SSH; k != nil {
			st.verdict.Profile = k.Profile
		}
	} else {
		if st.req.Session != "" {
			st.netLock = s.netLockOf(sessionKey{st.id.Key(), st.req.Session})
		}
		st.verdict = st.policy.Decide(st.id, policy.Request{
			Argv: st.argv, Shell: st.req.Shell, Session: st.req.Session, Interactive: st.interactive,
			Timeout: time.Duration(st.req.TimeoutMS) * time.Millisecond, Env: st.req.Env,
			Puts: uploads(st.req.Put), Gets: len(st.req.Get), Net: (*policy.NetLimit)(st.req.Net), NetLock: st.netLock,
		})
	}
	if err := s.auditDecision(st); err != nil {
		return nil, unaudited(err)
	}
	if !st.verdict.Allowed {
		log.Info("denied", "profile", st.verdict.Profile, "rule", st.verdict.Rule, "reason", st.verdict.Reason)
		return nil, &RequestError{Kind: ErrDenied, Msg: st.verdict.Reason, Profile: st.verdict.Profile, Rule: st.verdict.Rule, RequestID: st.reqID,
			Receipt: s.signReceipt(st, execOutcome{})}
	}
	target, err := s.acquireVM(ctx, st)
	if err != nil {
		s.auditExec(st, execOutcome{err: err})
		re := requestError(err, st)
		re.Receipt = s.signReceipt(st, execOutcome{err: err})
		return nil, re
	}
	return target, nil
}

// admitted is a request the exec core took in (admit): decided, audited,
// its VM acquired, counted in flight. Its front door runs it (Run) or
// gives it up (Abort), once.
type admitted struct {
	s      *Server
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
	defer a.s.end()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(a.s.execCtx, cancel)()
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

// Abort gives the request up before its command ran: its VM is released
// as one not fit for use.
func (a *admitted) Abort() {
	defer a.s.end()
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
}

func (s *Server) acquireVM(ctx context.Context, st *execState) (*vmTarget, error) {
	if st.req.Session != "" {
		return s.sessionVM(ctx, st)
	}
	return s.bootVM(ctx, st)
}

// release ends a request's use of its VM. A session's is kept, unless it
// is not fit for use (ok false: it failed, or its request's stream
// broke): the session then ends. A fresh VM is destroyed after the result
// is sent, not before: the caller need not wait for QEMU to exit and its
// files to go. Its slot stays taken until then, and shutdown waits for it
// (begin/end). A fresh VM not fit for use is destroyed first, so that an
// error reaches a caller with the VM's disk space (what a full disk needs
// back) and slot already freed; a failed VM's QEMU is gone, so that costs
// only its files.
func (s *Server) release(t *vmTarget, ok bool) {
	if ss := t.session; ss != nil {
		if !ok {
			s.destroySession(ss, "vm failed")
		}
		ss.give()
		return
	}
	destroy := func() {
		if err := t.vm.Close(); err != nil {
			s.log.Error("destroy vm", "vm", t.vm.ID, "err", err)
		}
		t.slot()
	}
	if !ok || !s.begin() {
		destroy()
		return
	}
	go func() {
		defer s.end()
		destroy()
	}()
}

// bootVM takes a VM slot (waiting in the bounded queue) and boots a fresh
// VM shaped by the verdict; the target holds the slot. If the client goes
// away while queued or booting, ctx ends and vm.Start cleans up.
func (s *Server) bootVM(ctx context.Context, st *execState) (*vmTarget, error) {
	v := st.verdict
	t0 := time.Now()
	release, err := s.slots.acquire(ctx, slotClaim{profile: v.Profile, profileMax: v.Limits.MaxVMs,
		caller: st.id.Key(), callerMax: v.Limits.CallerVMs, callerQueue: v.Limits.CallerQueue})
	if err != nil {
		s.metrics.refusedBusy()
		return nil, &RequestError{Kind: ErrBusy, Msg: fmt.Sprintf("%v (max %d VMs, profile %q max %d, %d per caller)", err, s.cfg.MaxVMs, v.Profile, v.Limits.MaxVMs, v.Limits.CallerVMs)}
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
	// that it is this request's VM.
	if n := v.Network; n != nil {
		t.vm.Network().SetPolicy(netstack.Policy{Egress: *n, Audit: s.netAudit(st, t.vm.ID)})
	}
	return t, nil
}

// limitToLifetime ends a session's command, at the latest, when the
// session's lifetime ends: chained commands cannot outlive max_lifetime.
func limitToLifetime(st *execState, ss *session) {
	left := time.Until(ss.created.Add(ss.max))
	if t := &st.verdict.Limits.Timeout; *t == 0 || left < *t {
		*t = max(left, time.Second)
	}
}

// sessionNetwork gives a reused session VM's network this request's
// verdict (the policy may have been reloaded since the session began)
// and audit, so that its connections are recorded as this request's. A
// session without a NIC cannot get one: the caller must end it first.
func (s *Server) sessionNetwork(st *execState, t *vmTarget) error {
	n, vn := st.verdict.Network, t.vm.Network()
	t.session.mu.Lock()
	t.session.egress = n
	t.session.mu.Unlock()
	switch {
	case vn == nil && n != nil && len(n.Rules) > 0:
		return &RequestError{Kind: ErrBadRequest, RequestID: st.reqID, Msg: fmt.Sprintf("session %q has no network (it began before the profile had one): end the session to start it again with one", st.req.Session)}
	case vn == nil: // none, or narrowed to nothing
		return nil
	case n == nil: // the profile no longer allows any network
		vn.SetPolicy(netstack.Policy{Audit: s.netAudit(st, t.vm.ID)})
	default:
		vn.SetPolicy(netstack.Policy{Egress: *n, Audit: s.netAudit(st, t.vm.ID)})
	}
	return nil
}

// sessionVM is the VM of the caller's session named in st: a running
// session's, or a paused one's resumed, or a new session's. A session
// busy with the same caller's previous command (whose client may just
// have gone: a pipeline's head) is waited for, as long as a VM slot is
// (QueueWait); a session that was lost is said so, once.
func (s *Server) sessionVM(ctx context.Context, st *execState) (*vmTarget, error) {
	// Sessions belong to their caller: a uid, or an SSH key.
	key := sessionKey{st.id.Key(), st.req.Session}
	for {
		s.mu.Lock()
		ss := s.sessions[key]
		s.mu.Unlock()
		if ss == nil {
			if why := s.takeLost(key); why != "" {
				return nil, s.lostError(key.name, why)
			}
			return s.newSessionVM(ctx, st, key)
		}
		if err := ss.take(ctx, s.cfg.QueueWait); err != nil {
			if errors.Is(err, errSessionEnded) {
				continue // ended meanwhile: this command starts a new one
			}
			return nil, err
		}
		// The reaper runs once a second and skips busy sessions: the
		// lifetime is enforced here, on every use, as well. An expired
		// session is ended as the reaper would, and this command starts
		// a new one.
		if !time.Now().Before(ss.expiry()) {
			s.destroySession(ss, "expired")
			continue
		}
		if rerr := checkNetLock(ss, st); rerr != nil {
			ss.give()
			return nil, rerr
		}
		if ss.paused() {
			if err := s.resume(ctx, ss, st); err != nil {
				ss.give()
				return nil, err
			}
		}
		limitToLifetime(st, ss)
		ss.mu.Lock()
		v := ss.vm
		ss.mu.Unlock()
		t := &vmTarget{vm: v, session: ss, jail: jailOf(v)}
		if err := s.sessionNetwork(st, t); err != nil {
			s.release(t, true)
			return nil, err
		}
		return t, nil
	}
}

// newSessionVM makes the caller's new session key, with a fresh VM.
func (s *Server) newSessionVM(ctx context.Context, st *execState, key sessionKey) (*vmTarget, error) {
	v := st.verdict
	t, err := s.bootVM(ctx, st)
	if err != nil {
		return nil, err
	}
	ss := newSession(key, st.id, v, s.shape(v), time.Now())
	ss.vm, ss.release = t.vm, t.slot
	if err := s.writeSession(ss, wire.SessionRunning, "", time.Time{}); err != nil {
		_ = t.vm.Close()
		t.slot()
		return nil, &RequestError{Kind: ErrVMFailed, Msg: "start session: " + err.Error()}
	}
	s.mu.Lock()
	if other := s.sessions[key]; other != nil {
		// Two first requests raced: keep the first, drop ours.
		s.mu.Unlock()
		_ = t.vm.Close()
		t.slot()
		_ = os.RemoveAll(s.sessionDir(ss.sid))
		return nil, &RequestError{Kind: ErrSessionBusy, Msg: fmt.Sprintf("session %q is being created by another request", key.name)}
	}
	s.sessions[key] = ss
	s.mu.Unlock()
	limitToLifetime(st, ss)
	rec := audit.Record{Kind: audit.KindSession, RequestID: st.reqID, Session: key.name, VMID: t.vm.ID, Profile: v.Profile, Message: "created"}
	setCaller(&rec, st.id)
	_ = s.audit.Write(rec)
	t.session, t.slot = ss, nil
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

// uploads is what a request's puts declare, for the policy.
func uploads(puts []wire.PutSpec) []policy.Upload {
	var out []policy.Upload
	for _, p := range puts {
		out = append(out, policy.Upload{Files: p.Files, Bytes: p.Bytes})
	}
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
			Argv: st.argv, Env: st.verdict.Env, Dir: st.req.Dir, User: st.verdict.User,
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
		s.flushGated(s.netGate, target.vm.ID)
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

// errCancelled marks a command whose client closed its stream before the
// command's end (vm-exec interrupted, an MCP client's
// notifications/cancelled): the command was killed for it, and its audit
// record says so.
var errCancelled = errors.New("cancelled by the client (its stream closed before the command ended)")

func cancelledByClient(err error) error {
	if err == nil {
		return errCancelled
	}
	return fmt.Errorf("%w: %w", errCancelled, err)
}

// execOutcome is what an exec produced, for its audit record and result.
type execOutcome struct {
	res    *vm.ExecResult // nil when the command did not complete
	target *vmTarget      // nil when no VM was obtained
	err    error
	// The streams as relayed (zero when the command did not run).
	stdin, stdout, stderr receipt.Stream
	execDur               time.Duration
	transfers             []wire.Transfer
	diskBytes             int64 // the VM's overlay on the host's disk when the command ended
}

// auditExec writes the exec record of an outcome.
func (s *Server) auditExec(st *execState, o execOutcome) {
	rec := audit.Record{Kind: audit.KindExec, RequestID: st.reqID,
		Profile: st.verdict.Profile, Argv: st.argv, Shell: st.req.Shell, Session: st.req.Session,
		Image: st.verdict.Image, ImageDigest: s.host.ImageDigestOf(st.verdict.Image), DurationMS: time.Since(st.start).Milliseconds(),
		StdinBytes: o.stdin.Bytes, StdinSHA256: o.stdin.SHA256, StdoutSHA256: o.stdout.SHA256, StderrSHA256: o.stderr.SHA256}
	setCaller(&rec, st.id)
	rec.Network = auditNetwork(st.verdict)
	if t := o.target; t != nil {
		rec.VMID, rec.BootMS, rec.VMStart, rec.DiskBytes = t.vm.ID, t.boot.Milliseconds(), t.start, o.diskBytes
		if t.jail != "" {
			rec.Message = "jail: " + t.jail
		}
	}
	if res := o.res; res != nil {
		code := res.ExitCode
		rec.ExitCode, rec.Signal, rec.TimedOut = &code, res.Signal, res.TimedOut
		rec.StdoutBytes, rec.StderrBytes = res.StdoutBytes, res.StderrBytes
		rec.Truncated = res.StdoutTruncated || res.StderrTruncated
	}
	if o.err != nil {
		rec.Error = vm.Details(o.err)
	}
	if len(o.transfers) > 0 {
		rec.Transfers = auditTransfers(st.req, o.transfers)
	}
	e, err := s.audit.Append(rec)
	if err != nil {
		s.log.Error("audit exec record", "req", st.reqID, "err", err)
		st.recorded, st.auditNote = nil, "the exec record could not be written: "+err.Error()
		return
	}
	st.recorded = &e
}

// result is an outcome as the protocol reports it.
func result(st *execState, o execOutcome) wire.Result {
	out := wire.Result{RequestID: st.reqID, Profile: st.verdict.Profile, TotalMS: time.Since(st.start).Milliseconds(), ExecMS: o.execDur.Milliseconds()}
	if t := o.target; t != nil {
		out.VMID, out.BootMS, out.QueueMS, out.VMStart = t.vm.ID, t.boot.Milliseconds(), t.queue.Milliseconds(), t.start
	}
	if res := o.res; res != nil {
		out.ExitCode, out.Signal, out.TimedOut = res.ExitCode, res.Signal, res.TimedOut
		out.StdoutTruncated, out.StderrTruncated = res.StdoutTruncated, res.StderrTruncated
		out.StdoutBytes, out.StderrBytes = res.StdoutBytes, res.StderrBytes
	}
	out.Transfers = o.transfers
	return out
}
