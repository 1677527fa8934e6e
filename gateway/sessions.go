package gateway

// Sessions: VMs kept for a caller across commands, that last and branch.
// A running session can be paused to disk (a save point of its VM, package
// vm: RAM, device state and disk in STATE/sessions/SID/), which frees its
// VM and its slot; its next command resumes it (session_pause.go). A
// session can be forked into copies, each a new session restored from one
// save point of it (session_fork.go). Paused sessions outlive the daemon
// (session_store.go); the ones that were running when it died are lost,
// which their owner's next command is told (session_lost.go). The reaper
// ends expired and dead sessions and pauses idle ones (session_reaper.go).
// A session's network can be locked (netlock.go) and its ports published
// on the host (publish.go).
//
// The sessions reach the rest of the daemon through sessionCore, and
// through the leaves they share with it: the VM host, the VM slots, the
// recorder.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// sessionCore is the rest of the daemon as the sessions see it (Server
// implements it), as sshfront.Core is for the SSH front door.
type sessionCore interface {
	// enter takes a lease for a request in flight (lease.go).
	enter(ctx context.Context) (*lease, *RequestError)
	// policyNow is the policy in force.
	policyNow() *policy.Policy
	// shape is the VM shape of a verdict, as the host makes VMs.
	shape(v policy.Verdict) vm.Shape
	// boot takes a VM slot and a fresh VM for st: a new session's.
	boot(ctx context.Context, st *execState) (*vmTarget, error)
}

// sessions owns every session of every caller.
type sessions struct {
	core  sessionCore
	host  *vm.Host
	slots *slots
	rec   *recorder
	log   *slog.Logger
	// stateDir holds sessions/, forks/ and lost/.
	stateDir string
	// queueWait bounds a wait for a busy session, grace the pauses at
	// shutdown.
	queueWait, grace time.Duration

	mu    sync.Mutex
	table map[sessionKey]*session
	lost  *lostNotes
	// reserved holds, per owner, what the pauses under way will hold
	// (pauseBudget).
	reserved map[string]pauseReserved
	// pausing admits one automatic pause at a time.
	pausing chan struct{}
	// arming gives sessions their new secrets one at a time (armSession).
	arming sync.Mutex
}

func newSessions(core sessionCore, host *vm.Host, sl *slots, rec *recorder, log *slog.Logger, stateDir string, queueWait, grace time.Duration) *sessions {
	return &sessions{core: core, host: host, slots: sl, rec: rec, log: log, stateDir: stateDir, queueWait: queueWait, grace: grace,
		table: map[sessionKey]*session{}, reserved: map[string]pauseReserved{}, lost: newLostNotes(filepath.Join(stateDir, lostDir), log), pausing: make(chan struct{}, 1)}
}

// get returns the session of key, or nil.
func (x *sessions) get(key sessionKey) *session {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.table[key]
}

// all is a snapshot of the sessions.
func (x *sessions) all() []*session {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make([]*session, 0, len(x.table))
	for _, ss := range x.table {
		out = append(out, ss)
	}
	return out
}

// list is what owner's sessions (every caller's when owner is "") look
// like now, sorted by name; describe names each one's owner when set.
func (x *sessions) list(owner string, describe bool) []wire.Session {
	out := []wire.Session{}
	for _, ss := range x.all() {
		if owner != "" && ss.Owner != owner {
			continue
		}
		info := ss.info()
		if describe {
			info.Owner = describeCaller(ss.Caller)
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// count counts the sessions, the paused ones and their disk, for the
// metrics.
func (x *sessions) count() (all, paused int, pausedBytes int64) {
	list := x.all()
	for _, ss := range list {
		ss.mu.Lock()
		if ss.State == statePaused && ss.sp != nil {
			paused++
			pausedBytes += ss.sp.Meta.DiskBytes()
		}
		ss.mu.Unlock()
	}
	return len(list), paused, pausedBytes
}

func (x *sessions) dir(sid string) string {
	return filepath.Join(x.stateDir, sessionsDir, sid)
}

// register makes ss, running in its VM, one of its owner's sessions:
// its file is written, it joins the table unless another request took its
// name meanwhile (ErrSessionBusy, naming it), and its creation is
// audited for q (created says how). It serves new sessions and fork
// copies alike. On error nothing of ss is kept but its VM and slot, which
// the caller releases.
func (x *sessions) register(ss *session, q *request, created string, rec audit.Record) error {
	if err := x.store(ss, nil); err != nil {
		return err
	}
	x.mu.Lock()
	if x.table[ss.key()] != nil {
		x.mu.Unlock()
		_ = os.RemoveAll(x.dir(ss.sid))
		return &RequestError{Kind: ErrSessionBusy, Msg: fmt.Sprintf("session %q was made by another request meanwhile", ss.Name)}
	}
	x.table[ss.key()] = ss
	x.mu.Unlock()
	rec.Kind, rec.RequestID, rec.Session, rec.VMID, rec.Profile, rec.Message = audit.KindSession, q.reqID, ss.Name, ss.vm.ID, ss.Profile, created
	setCaller(&rec, q.id)
	_ = x.rec.Write(rec)
	return nil
}

// destroy ends the session for good (once): its VM is closed and its
// slot freed, or its save point removed; its files go; the end is
// audited. A running operation on the session sees it ended.
func (x *sessions) destroy(ss *session, why string) {
	v, slot, sp, ok := ss.end()
	if !ok {
		return
	}
	x.mu.Lock()
	if x.table[ss.key()] == ss {
		delete(x.table, ss.key())
	}
	x.mu.Unlock()
	ss.stopPublications("the session ended: " + why)
	x.endProcs(ss, why)
	vmID := ""
	if v != nil {
		vmID = v.ID
		if err := v.Close(); err != nil {
			x.log.Error("destroy session vm", "session", ss.Name, "err", err)
		}
		slot()
		x.rec.flushNet(v.ID)
	}
	if sp != nil {
		if err := sp.Discard(); err != nil {
			x.log.Error("remove a session's save point", "session", ss.Name, "err", err)
		}
	}
	if err := os.RemoveAll(x.dir(ss.sid)); err != nil {
		x.log.Error("remove a session's files", "session", ss.Name, "err", err)
	}
	x.audit(ss, nil, audit.Record{VMID: vmID, Message: "ended: " + why})
	x.log.Info("session ended", "session", ss.Name, "owner", ss.Owner, "vm", vmID, "why", why)
}

// audit writes a session record of ss: for request q, or (q nil) for the
// session itself, under its creator's identity.
func (x *sessions) audit(ss *session, q *request, rec audit.Record) {
	rec.Kind, rec.Session, rec.Profile = audit.KindSession, ss.Name, ss.Profile
	if q != nil {
		rec.RequestID = q.reqID
		setCaller(&rec, q.id)
	} else {
		setCaller(&rec, ss.Caller)
	}
	if err := x.rec.Write(rec); err != nil {
		x.log.Error("audit a session's record", "session", ss.Name, "err", err)
	}
}

// operate is the way in for a request on a session itself (pause, fork,
// network lock), as admit is for a command: a lease (refused with
// ErrShutdown once shutdown began), the policy's decision of q (decide;
// audited, a denial through the deny flood gate), then op as the
// session's owner, after a command that runs in it (waited for as long
// as a VM slot is). ctx ends when the client goes away or the shutdown
// grace period is over.
func (x *sessions) operate(ctx context.Context, q *sessionRequest, ss *session, decide func(*policy.Policy, *sessionRequest) policy.Verdict, op func(context.Context) error) *RequestError {
	l, rerr := x.core.enter(ctx)
	if rerr != nil {
		rerr.RequestID = q.reqID
		return rerr
	}
	defer l.end()
	q.policy = x.core.policyNow()
	q.verdict = decide(q.policy, q)
	if err := x.rec.decision(&q.request, q.decisionRecord()); err != nil {
		return &RequestError{Kind: ErrAuditUnavailable, Msg: "refusing to run unaudited: " + err.Error(), RequestID: q.reqID}
	}
	if !q.verdict.Allowed {
		return &RequestError{Kind: ErrDenied, Msg: q.verdict.Reason, Profile: q.verdict.Profile, Rule: q.verdict.Rule, RequestID: q.reqID}
	}
	if err := ss.take(l.ctx, x.queueWait); err != nil {
		if errors.Is(err, errSessionEnded) {
			return &RequestError{Kind: wire.KindNotFound, Msg: fmt.Sprintf("session %q ended", ss.Name), RequestID: q.reqID}
		}
		return requestError(err, &q.request)
	}
	defer ss.give(true)
	if err := op(l.ctx); err != nil {
		return requestError(err, &q.request)
	}
	return nil
}

// onRunning is the way in for an operation on a session's guest that
// runs no command of its own (one on its background processes, a file
// operation): a lease, the policy's decision of q (the session's profile,
// decideSession; audited), then op in the session's VM with a share of the
// session, as a command has (resumed first when paused, made running
// again by another request meanwhile or not). ctx ends when the client
// goes away or the shutdown grace period is over.
func (x *sessions) onRunning(ctx context.Context, q *sessionRequest, ss *session, op func(context.Context, *vm.VM) error) *RequestError {
	return x.onRunningAs(ctx, q, ss, decideSession(), nil, op)
}

// onRunningAs is onRunning with the decision decide, and, when outcome is
// set, one audit record of the operation made after it (outcome turns its
// error into it) in place of the decision's record, which an allowed
// operation then does not write: a file operation is one record.
func (x *sessions) onRunningAs(ctx context.Context, q *sessionRequest, ss *session, decide func(*policy.Policy, *sessionRequest) policy.Verdict,
	outcome func(error) audit.Record, op func(context.Context, *vm.VM) error) (rerr *RequestError) {
	l, rerr := x.core.enter(ctx)
	if rerr != nil {
		rerr.RequestID = q.reqID
		return rerr
	}
	defer l.end()
	q.policy = x.core.policyNow()
	q.verdict = decide(q.policy, q)
	unaudited := func(err error) *RequestError {
		return &RequestError{Kind: ErrAuditUnavailable, Msg: "refusing to run unaudited: " + err.Error(), RequestID: q.reqID}
	}
	if outcome == nil || !q.verdict.Allowed {
		if err := x.rec.decision(&q.request, q.decisionRecord()); err != nil {
			return unaudited(err)
		}
	} else if err := x.rec.Healthy(); err != nil {
		return unaudited(err)
	}
	if !q.verdict.Allowed {
		return &RequestError{Kind: ErrDenied, Msg: q.verdict.Reason, Profile: q.verdict.Profile, Rule: q.verdict.Rule, RequestID: q.reqID}
	}
	if outcome != nil {
		var opErr error
		defer func() {
			rec := outcome(opErr)
			rec.RequestID, rec.Session, rec.Profile, rec.Verdict = q.reqID, ss.Name, q.verdict.Profile, audit.VerdictAllow
			if rerr != nil && rec.Error == "" {
				rec.Error = rerr.Msg
			}
			setCaller(&rec, q.id)
			if err := x.rec.Write(rec); err != nil {
				x.log.Error("audit a file operation", "session", ss.Name, "err", err)
			}
		}()
		inner := op
		op = func(ctx context.Context, v *vm.VM) error {
			opErr = inner(ctx, v)
			return opErr
		}
	}
	if err := ss.share(l.ctx, x.queueWait, max(q.verdict.Limits.MaxCommands, 1)); err != nil {
		if errors.Is(err, errSessionEnded) {
			return &RequestError{Kind: wire.KindNotFound, Msg: fmt.Sprintf("session %q ended", ss.Name), RequestID: q.reqID}
		}
		return requestError(err, &q.request)
	}
	if ss.state() == statePaused {
		if err := x.resumeFor(l.ctx, ss, &q.request); err != nil {
			return requestError(err, &q.request)
		}
	}
	defer ss.unshare(true)
	v := ss.running()
	if v == nil {
		return &RequestError{Kind: wire.KindNotFound, Msg: fmt.Sprintf("session %q ended", ss.Name), RequestID: q.reqID}
	}
	if err := op(l.ctx, v); err != nil {
		return opError(err, ss.Name, q.reqID)
	}
	return nil
}

// decideSession decides a pause, or a fork into newNames, in the
// session's image. Its verdict
// gives no network: the session keeps its own (a fork's copies, their
// parent's), and its decision record claims none.
func decideSession(newNames ...string) func(*policy.Policy, *sessionRequest) policy.Verdict {
	return func(p *policy.Policy, q *sessionRequest) policy.Verdict {
		v := p.DecideSession(q.id, q.image, newNames...)
		v.Network = nil
		return v
	}
}

// claim is the VM slot claim of a request.
func claim(q *request) slotClaim {
	v := q.verdict
	return slotClaim{profile: v.Profile, profileMax: v.Limits.MaxVMs, caller: q.id.Key(), callerMax: v.Limits.CallerVMs, callerQueue: v.Limits.CallerQueue}
}

// newSaveName names a new save point in a session's directory.
func newSaveName() string { return "sp-" + newRequestID()[:8] }

// since is how long ago t0 was, in ms, for the records.
func since(t0 time.Time) int64 { return time.Since(t0).Milliseconds() }
