package gateway

// A network narrowed per command and locked per session. The policy
// decides both (policy.Decide with Request.Net and NetLock,
// policy.DecideNetLock); here the lock is kept: in the session, in its
// session.json (pause.go: it outlives pauses and restarts), and in its
// fork copies. A lock takes effect at once on a running session's
// network, and no command runs on a lock other than the one its decision
// saw.

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm/netstack"
)

// netLockOf is the network lock of the caller's session key; nil when
// it is not locked, or does not exist.
func (s *Server) netLockOf(key sessionKey) *policy.NetLimit {
	s.mu.Lock()
	ss := s.sessions[key]
	s.mu.Unlock()
	if ss == nil {
		return nil
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.netLock
}

// checkNetLock refuses st if ss's network lock is not the one st was
// decided under: it was locked again while st waited for the session.
// A lock is replaced, never changed, so the pointer tells.
func checkNetLock(ss *session, st *execState) *RequestError {
	ss.mu.Lock()
	cur := ss.netLock
	ss.mu.Unlock()
	if cur == st.netLock {
		return nil
	}
	return &RequestError{Kind: ErrSessionBusy, RequestID: st.reqID, Profile: st.verdict.Profile,
		Msg: fmt.Sprintf("session %q's network was locked while this request waited for the session; nothing ran: send it again", ss.key.name)}
}

// auditNetwork is the network of verdict v for its audit records; nil
// when its VM has no NIC (or it was refused).
func auditNetwork(v policy.Verdict) *audit.NetVerdict {
	if v.Network == nil {
		return nil
	}
	n := &audit.NetVerdict{Allow: []string{}, Narrowed: v.NetNarrowed}
	for _, r := range v.Network.Rules {
		n.Allow = append(n.Allow, r.Text)
	}
	return n
}

// handleNetLockSession locks the caller's session's network to the
// rules of a wire.NetLimit (none: no network) for the rest of its life;
// the answer is the session.
func (s *Server) handleNetLockSession(w http.ResponseWriter, r *http.Request) {
	l, err := wire.DecodeNetLimit(r.Body)
	if err != nil {
		refuse(w, wire.KindBadRequest, err.Error())
		return
	}
	want := policy.NetLimit(*l)
	decide := func(p *policy.Policy, st *execState, ss *session) policy.Verdict {
		ss.mu.Lock()
		st.netLock = ss.netLock
		ss.mu.Unlock()
		return p.DecideNetLock(st.id, st.netLock, want)
	}
	s.sessionOp(w, r, decide, func(_ context.Context, ss *session, st *execState) error {
		if err := s.lockNet(ss, st, want); err != nil {
			return err
		}
		writeJSON(w, ss.info())
		return nil
	})
}

// lockNet locks ss's network to want, as st's verdict decided: a running
// session's network takes the locked one now (the open connections it
// does not allow are cut), its file keeps the lock, and the lock is
// audited (its decision was, before).
//
// Precondition: the caller owns ss; st.verdict allowed the lock.
func (s *Server) lockNet(ss *session, st *execState, want policy.NetLimit) error {
	if rerr := checkNetLock(ss, st); rerr != nil {
		return rerr
	}
	ss.mu.Lock()
	ss.netLock, ss.egress = &want, st.verdict.Network
	v := ss.vm
	ss.mu.Unlock()
	vmID := ""
	if v != nil {
		vmID = v.ID
		if n := v.Network(); n != nil {
			pol := netstack.Policy{Audit: s.netAudit(st, v.ID)}
			if e := st.verdict.Network; e != nil {
				pol.Egress = *e
			}
			n.SetPolicy(pol)
		}
	}
	rec := audit.Record{Kind: audit.KindSession, RequestID: st.reqID, Session: ss.key.name, VMID: vmID, Profile: ss.profile,
		Message: "network locked: allow [" + strings.Join(want.Allow, " ") + "]", Network: auditNetwork(st.verdict)}
	setCaller(&rec, st.id)
	if err := s.audit.Write(rec); err != nil {
		// The lock only takes away: it holds unaudited, its decision's
		// record stands.
		s.log.Error("audit a session's network lock", "session", ss.key.name, "err", err)
	}
	if err := s.rewriteSession(ss); err != nil {
		s.log.Error("a session's network lock not saved: it holds until vmgated stops", "session", ss.key.name, "err", err)
		return &RequestError{Kind: wire.KindInternal, Msg: fmt.Sprintf("session %q is locked, but its lock could not be saved (%v): it holds until vmgated stops", ss.key.name, err)}
	}
	return nil
}
