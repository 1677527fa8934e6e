package gateway

// A network narrowed per command and locked per session. The policy
// decides both (policy.Decide with Request.Net and NetLock,
// policy.DecideNetLock); here the lock is kept: in the session, in its
// record (session_store.go: it outlives pauses and restarts), and in its
// fork copies. A lock takes effect at once on a running session's
// network, and no command runs on a lock other than the one its decision
// saw.

import (
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
)

// netLockOf is the network lock of the caller's session key; nil when
// it is not locked, or does not exist.
func (x *sessions) netLockOf(key sessionKey) *policy.NetLimit {
	ss := x.get(key)
	if ss == nil {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.NetLock
}

// checkNetLock refuses q if ss's network lock is not the one q was
// decided under: it was locked again while q waited for the session.
// A lock is replaced, never changed, so the pointer tells.
func checkNetLock(ss *session, q *request) *RequestError {
	ss.mu.Lock()
	cur := ss.NetLock
	ss.mu.Unlock()
	if cur == q.netLock {
		return nil
	}
	return &RequestError{Kind: ErrSessionBusy, RequestID: q.reqID, Profile: q.verdict.Profile,
		Msg: fmt.Sprintf("session %q's network was locked while this request waited for the session; nothing ran: send it again", ss.Name)}
}

// decideNetLock decides a lock of a session's network to want.
func decideNetLock(ss *session, want policy.NetLimit) func(*policy.Policy, *sessionRequest) policy.Verdict {
	return func(p *policy.Policy, q *sessionRequest) policy.Verdict {
		ss.mu.Lock()
		q.netLock = ss.NetLock
		ss.mu.Unlock()
		return p.DecideNetLock(q.id, q.image, q.netLock, want)
	}
}

// lockNet locks ss's network to want, as q's verdict decided: a running
// session's network takes the locked one now (the open connections it
// does not allow are cut), its file keeps the lock, and the lock is
// audited (its decision was, before).
//
// Precondition: the caller owns ss; q's verdict allowed the lock.
func (x *sessions) lockNet(ss *session, q *sessionRequest, want policy.NetLimit) error {
	if rerr := checkNetLock(ss, &q.request); rerr != nil {
		return rerr
	}
	ss.mu.Lock()
	v := ss.vm
	if ss.State != stateRunning {
		v = nil
	}
	// The lock's network replaces the last command's narrowing.
	ss.NetLock, ss.net.last = &want, nil
	if v != nil {
		ss.net.audit = x.rec.netHook(&q.request, v.ID)
	}
	hook := ss.net.audit
	ss.mu.Unlock()
	vmID := ""
	if v != nil {
		vmID = v.ID
		k := ss.kit()
		x.setNetwork(v, q.verdict.Network, hook, k, q.policy.SessionSecrets(q.id, k.names()))
	}
	// The lock only takes away: it holds even if its record cannot be
	// written (its decision's record stands).
	x.audit(ss, &q.request, audit.Record{VMID: vmID, Message: "network locked: allow [" + strings.Join(want.Allow, " ") + "]", Network: auditNetwork(q.verdict)})
	if err := x.store(ss, nil); err != nil {
		x.log.Error("a session's network lock not saved: it holds until vmgated stops", "session", ss.Name, "err", err)
		return &RequestError{Kind: wire.KindInternal, Msg: fmt.Sprintf("session %q is locked, but its lock could not be saved (%v): it holds until vmgated stops", ss.Name, err)}
	}
	return nil
}
