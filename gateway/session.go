package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm"
)

// sessionKey names a session: its owner (policy.Identity.Key: a uid, or
// an SSH key) and the name the owner gave it. Two callers never share one.
type sessionKey struct {
	owner string
	name  string
}

// session is a VM kept for one caller across commands: running (vm set,
// holding a VM slot), or paused to disk (sp set, no VM and no slot;
// pause.go). One operation at a time owns it (take/give): a command, a
// pause, a resume, a fork, its end.
type session struct {
	key     sessionKey
	sid     string          // its directory under the state directory's sessions/
	id      policy.Identity // of the request that created it
	profile string
	shape   vm.Shape
	created time.Time
	idle    time.Duration
	max     time.Duration
	limits  policy.PausedLimits
	parent  string // the session it was forked from

	mu       sync.Mutex
	vm       *vm.VM        // nil while paused
	release  func()        // its VM slot; nil while paused
	sp       *vm.SavePoint // paused: its state; resumed: its disk's backing
	pausedAt time.Time
	egress   *netrule.Egress // the network its last command had
	// netLock is its network lock (netlock.go), nil when unlocked:
	// replaced by a narrower one, never changed or removed.
	netLock  *policy.NetLimit
	busy     bool
	free     chan struct{} // closed and replaced whenever it stops being busy
	lastUsed time.Time
	closed   bool
	ended    chan struct{} // closed with closed
	// noPauseUntil: an automatic pause that was refused (a budget) is
	// not tried again before it.
	noPauseUntil time.Time
	// pubs are its published ports (publish.go); forwarding counts the
	// connections they carry now, which are use: while one is open the
	// session is neither idle nor paused automatically.
	pubs       []*publication
	forwarding int
	// idleWork is housekeeping no request waits for, which the reaper
	// runs once the session is not in use (whenIdle).
	idleWork []func()
}

func newSession(key sessionKey, id policy.Identity, v policy.Verdict, shape vm.Shape, now time.Time) *session {
	return &session{key: key, sid: newRequestID(), id: id, profile: v.Profile, shape: shape, created: now, lastUsed: now,
		idle: v.Limits.SessionIdle, max: v.Limits.SessionMax, limits: v.Limits.Paused, egress: v.Network,
		busy: true, free: make(chan struct{}), ended: make(chan struct{})}
}

// errSessionEnded reports a session that ended while a request waited
// for it: the request starts a new one.
var errSessionEnded = errors.New("session ended")

// take waits until the session is free, at most wait and while ctx
// lasts, and makes the caller its owner.
func (ss *session) take(ctx context.Context, wait time.Duration) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		ss.mu.Lock()
		switch {
		case ss.closed:
			ss.mu.Unlock()
			return errSessionEnded
		case !ss.busy:
			ss.busy = true
			ss.mu.Unlock()
			return nil
		}
		free := ss.free
		ss.mu.Unlock()
		select {
		case <-free:
		case <-ss.ended:
		case <-t.C:
			return &RequestError{Kind: ErrSessionBusy, Msg: fmt.Sprintf("session %q is still running another command after %v", ss.key.name, wait)}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// tryTake makes the caller the session's owner if it is free now.
func (ss *session) tryTake() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed || ss.busy {
		return false
	}
	ss.busy = true
	return true
}

// give ends the caller's ownership.
func (ss *session) give() {
	ss.mu.Lock()
	ss.busy = false
	ss.lastUsed = time.Now()
	close(ss.free)
	ss.free = make(chan struct{})
	ss.mu.Unlock()
}

// whenIdle has the reaper run f (in a goroutine of its own) at its first
// round (once a second) that finds the session not in use: after the
// operation that owns it now has ended.
func (ss *session) whenIdle(f func()) {
	ss.mu.Lock()
	ss.idleWork = append(ss.idleWork, f)
	ss.mu.Unlock()
}

// forwardStarts and forwardEnds count a connection of a published port:
// its end is the session's last use.
func (ss *session) forwardStarts() {
	ss.mu.Lock()
	ss.forwarding++
	ss.mu.Unlock()
}

func (ss *session) forwardEnds() {
	ss.mu.Lock()
	ss.forwarding--
	ss.lastUsed = time.Now()
	ss.mu.Unlock()
}

// paused reports whether the session is paused (under its owner).
func (ss *session) paused() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.vm == nil
}

func (ss *session) expiry() time.Time {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.expiryLocked()
}

// expiryLocked is when the session ends unless used again: idle timeout or
// lifetime, whichever comes first; a paused session only at its lifetime.
// Precondition: ss.mu held.
func (ss *session) expiryLocked() time.Time {
	m := ss.created.Add(ss.max)
	if ss.vm == nil || ss.forwarding > 0 {
		return m
	}
	if e := ss.lastUsed.Add(ss.idle); e.Before(m) {
		return e
	}
	return m
}

// pauseDue reports whether a running, idle session is due for an automatic
// pause at now: idle for pause_after, or for idle_timeout when pause_after
// is set. Precondition: ss.mu held.
func (ss *session) pauseDueLocked(now time.Time) bool {
	after := ss.limits.After
	if after <= 0 || ss.vm == nil || ss.busy || ss.forwarding > 0 || now.Before(ss.noPauseUntil) {
		return false
	}
	return !now.Before(ss.lastUsed.Add(min(after, ss.idle)))
}

func (ss *session) info() wire.Session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := wire.Session{Name: ss.key.name, Profile: ss.profile, Created: ss.created,
		LastUsed: ss.lastUsed, ExpiresAt: ss.expiryLocked(), Busy: ss.busy, State: wire.SessionRunning, Parent: ss.parent,
		NetLock: (*wire.NetLimit)(ss.netLock)}
	for _, p := range ss.pubs {
		out.Published = append(out.Published, fmt.Sprintf("%s->%d", p.host, p.port))
	}
	if ss.vm != nil {
		out.VMID = ss.vm.ID
	} else {
		out.State, out.PausedAt = wire.SessionPaused, ss.pausedAt
		if ss.sp != nil {
			out.DiskBytes = ss.sp.Meta.DiskBytes()
		}
	}
	return out
}

// destroySession ends the session for good (once): its VM is closed and
// its slot freed, or its save point removed; its files go; the end is
// audited. A running operation on the session sees it closed.
func (s *Server) destroySession(ss *session, why string) {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.closed = true
	close(ss.ended)
	v, release, sp := ss.vm, ss.release, ss.sp
	ss.vm, ss.release, ss.sp = nil, nil, nil
	ss.mu.Unlock()
	s.mu.Lock()
	if s.sessions[ss.key] == ss {
		delete(s.sessions, ss.key)
	}
	s.mu.Unlock()
	ss.stopPublications("the session ended: " + why)
	vmID := ""
	if v != nil {
		vmID = v.ID
		if err := v.Close(); err != nil {
			s.log.Error("destroy session vm", "session", ss.key.name, "err", err)
		}
		release()
		s.flushGated(s.netGate, v.ID)
	}
	if sp != nil {
		if err := sp.Discard(); err != nil {
			s.log.Error("remove a session's save point", "session", ss.key.name, "err", err)
		}
	}
	if err := os.RemoveAll(s.sessionDir(ss.sid)); err != nil {
		s.log.Error("remove a session's files", "session", ss.key.name, "err", err)
	}
	rec := audit.Record{Kind: audit.KindSession, Session: ss.key.name, VMID: vmID, Profile: ss.profile, Message: "ended: " + why}
	setCaller(&rec, ss.id)
	rec.PID = 0 // the creating request's process, not the one ending it
	_ = s.audit.Write(rec)
	s.log.Info("session ended", "session", ss.key.name, "owner", ss.key.owner, "vm", vmID, "why", why)
}

// allSessions is a snapshot of the sessions.
func (s *Server) allSessions() []*session {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	return all
}

// startReaper ends sessions that expired or whose VM died, and pauses
// the idle ones due for it (one pause at a time: a pause costs the host a
// QEMU's start and a copy of the guest's RAM).
func (s *Server) startReaper() func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				s.reap(now)
			}
		}
	}()
	return func() { close(stop); <-done }
}

// reap is one round of the reaper.
func (s *Server) reap(now time.Time) {
	for _, ss := range s.allSessions() {
		ss.mu.Lock()
		dead := ss.vm != nil && ss.vm.Gone()
		busy := ss.busy
		expired := !ss.busy && !now.Before(ss.expiryLocked())
		due := ss.pauseDueLocked(now)
		var work []func()
		if !busy {
			work, ss.idleWork = ss.idleWork, nil
		}
		ss.mu.Unlock()
		if len(work) > 0 {
			go func() {
				for _, f := range work {
					f()
				}
			}()
		}
		switch {
		case dead && busy:
			s.destroySession(ss, "its vm died") // its command is told
		case dead:
			// No command saw it: the owner's next one is told, rather
			// than run in a new, empty session.
			s.loseSession(ss, "its VM died while no command ran")
		case due:
			if ss.tryTake() {
				s.autoPause(ss, now)
			}
		case expired:
			s.destroySession(ss, "expired")
		}
	}
}

func (s *Server) listSessions(id policy.Identity) []wire.Session {
	owner := id.Key()
	s.mu.Lock()
	var out []wire.Session
	for k, ss := range s.sessions {
		if k.owner == owner {
			out = append(out, ss.info())
		}
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
