package gateway

import (
	"sort"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// sessionKey names a session: its owner (policy.Identity.Key: a uid, or an SSH
// key) and the name the owner gave it. Two callers never share one.
type sessionKey struct {
	owner string
	name  string
}

// session is a VM kept for one caller across commands.
type session struct {
	key     sessionKey
	id      policy.Identity // of the request that created it
	profile string
	vm      *vm.VM
	release func() // its VM slot
	created time.Time
	idle    time.Duration
	max     time.Duration

	mu       sync.Mutex
	busy     bool
	lastUsed time.Time
	closed   bool
	ended    chan struct{} // closed with closed
}

func (ss *session) expiry() time.Time {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.expiryLocked()
}

// expiryLocked is when the session ends unless used again: idle timeout or
// lifetime, whichever comes first. Precondition: ss.mu held.
func (ss *session) expiryLocked() time.Time {
	e := ss.lastUsed.Add(ss.idle)
	if m := ss.created.Add(ss.max); m.Before(e) {
		e = m
	}
	return e
}

func (ss *session) info() wire.Session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return wire.Session{Name: ss.key.name, VMID: ss.vm.ID, Profile: ss.profile, Created: ss.created,
		LastUsed: ss.lastUsed, ExpiresAt: ss.expiryLocked(), Busy: ss.busy}
}

// destroy closes the session's VM and frees its slot (once).
func (s *Server) destroySession(ss *session, why string) {
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		return
	}
	ss.closed = true
	close(ss.ended)
	ss.mu.Unlock()
	s.mu.Lock()
	if s.sessions[ss.key] == ss {
		delete(s.sessions, ss.key)
	}
	s.mu.Unlock()
	if err := ss.vm.Close(); err != nil {
		s.log.Error("destroy session vm", "session", ss.key.name, "err", err)
	}
	ss.release()
	s.flushGated(s.netGate, ss.vm.ID)
	rec := audit.Record{Kind: audit.KindSession, Session: ss.key.name, VMID: ss.vm.ID, Profile: ss.profile, Message: "ended: " + why}
	setCaller(&rec, ss.id)
	rec.PID = 0 // the creating request's process, not the one ending it
	_ = s.audit.Write(rec)
	s.log.Info("session ended", "session", ss.key.name, "owner", ss.key.owner, "vm", ss.vm.ID, "why", why)
}

func (s *Server) closeAllSessions(why string) {
	s.mu.Lock()
	all := make([]*session, 0, len(s.sessions))
	for _, ss := range s.sessions {
		all = append(all, ss)
	}
	s.mu.Unlock()
	for _, ss := range all {
		s.destroySession(ss, why)
	}
}

// startReaper ends idle or expired sessions and those whose VM died.
func (s *Server) startReaper() func() {
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				s.mu.Lock()
				var expired []*session
				for _, ss := range s.sessions {
					ss.mu.Lock()
					busy := ss.busy
					ss.mu.Unlock()
					select {
					case <-ss.vm.Exited():
						expired = append(expired, ss)
						continue
					default:
					}
					if !busy && now.After(ss.expiry()) {
						expired = append(expired, ss)
					}
				}
				s.mu.Unlock()
				for _, ss := range expired {
					s.destroySession(ss, "expired or vm gone")
				}
			}
		}
	}()
	return func() { close(stop) }
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
