package gateway

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sync"

	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

// sessionKey names a session: its owner (policy.Identity.Key: a uid, or
// an SSH key) and the name the owner gave it. Two callers never share one.
type sessionKey struct {
	owner string
	name  string
}

// sessionState is where a session is in its life. A session is running
// (a VM and its VM slot) or paused (a save point on disk, no VM, no slot)
// until it ends; its file records running or paused.
type sessionState string

const (
	stateRunning sessionState = wire.SessionRunning
	statePaused  sessionState = wire.SessionPaused
	// stateEnded is never written: a session's end removes its file.
	stateEnded sessionState = "ended"
)

// sessionRecord is the persisted half of a session: its file,
// STATE/sessions/SID/session.json, is this record marshalled whole
// (session_store.go). Its format is version 1 (sessionRecordVersion).
type sessionRecord struct {
	Version int             `json:"version"`
	Owner   string          `json:"owner"`
	Name    string          `json:"name"`
	Caller  policy.Identity `json:"caller"` // of the request that created it (no pid)
	Profile string          `json:"profile"`
	Created time.Time       `json:"created"`
	// Idle and Max are its idle timeout and lifetime; Paused its
	// profile's rules for paused sessions.
	Idle   time.Duration       `json:"idle_ns"`
	Max    time.Duration       `json:"max_ns"`
	Paused policy.PausedLimits `json:"paused_limits"`
	Shape  vm.Shape            `json:"shape"`
	Parent string              `json:"parent,omitempty"` // the session it was forked from
	State  sessionState        `json:"state"`
	// Save names its save point (a directory beside the file): paused,
	// its state; running after a resume, its disk's backing.
	Save     string    `json:"save_point,omitempty"`
	PausedAt time.Time `json:"paused_at,omitzero"`
	// NetLock is its network lock (netlock.go), nil when unlocked:
	// replaced by a narrower one, never changed or removed.
	NetLock *policy.NetLimit `json:"net_lock,omitempty"`
	// Procs are its background processes whose end is still to be
	// audited (procs.go).
	Procs []pendingProc `json:"procs,omitempty"`
	// Secrets are its secrets' placeholders and the CA its guest trusts
	// (secrets.go); never a value.
	Secrets *secretKit `json:"secrets,omitempty"`
	// ImageSource is where its image came from, with its configuration
	// and manifest digest, when it began (nil: a built image, or a
	// session older than the field): its VM runs that image's files, so
	// its commands take their defaults from it and are decided and
	// audited with its digest, not with those of an image imported
	// again under the same name since.
	ImageSource *vm.ImageSource `json:"image_source,omitempty"`
}

// sessionRecordVersion is the version of the session file's format.
const sessionRecordVersion = 1

func (r *sessionRecord) key() sessionKey { return sessionKey{r.Owner, r.Name} }

// session is a VM kept for one caller across commands. Its record's State
// says whether it runs (vm and slot set) or is paused (sp set). One
// operation at a time owns it (take/give): a command, a pause, a resume,
// a fork, its end.
//
// Lock order: sessions.mu before session.mu.
type session struct {
	sessionRecord        // guarded by mu where it changes: State, Save, PausedAt, NetLock, Paused
	sid           string // its directory under STATE/sessions

	mu   sync.Mutex
	vm   *vm.VM        // running: its VM
	slot func()        // running: its VM slot
	sp   *vm.SavePoint // paused: its state; resumed: its disk's backing
	// net is what its network between commands is made of.
	net   sessionNet
	use   sessionUse
	ended chan struct{} // closed when State becomes stateEnded
	// pubs are its published ports (publish.go).
	pubs []*publication
	// watching holds the background processes whose end is watched now,
	// by handle, with the VM they are watched in (procs.go).
	watching map[int64]*vm.VM
}

// sessionUse is how a session is used: by commands, many at once (up to
// sessions.max_commands), or by one operation that owns it alone (a
// pause, a resume, a fork, a network lock); and its idleness for the
// reaper. Guarded by session.mu.
type sessionUse struct {
	cmds int  // commands (and calls on its processes) that use it now
	excl bool // an operation owns it alone
	// wantExcl counts operations waiting to own it alone: new commands
	// wait behind them, so that a pause is not starved by a stream of
	// commands.
	wantExcl int
	free     chan struct{} // closed and replaced whenever a use ends
	// yield is closed and replaced when an operation starts waiting to
	// own the session alone: the calls that only watch its processes
	// (a logs follow, a wait) let go then, as commands do not, so that
	// a client watching a process does not hold off a pause or a fork.
	yield chan struct{}
	// lastUsed is when a use last ended, or its published ports last
	// carried bytes: traffic is use, an open connection alone is not.
	lastUsed time.Time
	// noPauseUntil: an automatic pause that was refused (a budget) is
	// not tried again before it.
	noPauseUntil time.Time
	// idleWork is housekeeping no request waits for, which the reaper
	// runs once the session is not in use (whenIdle).
	idleWork []func()
}

// newSessionUse is the use of a session owned by its maker (excl) or by
// nobody, last used at lastUsed.
func newSessionUse(excl bool, lastUsed time.Time) sessionUse {
	return sessionUse{excl: excl, free: make(chan struct{}), yield: make(chan struct{}), lastUsed: lastUsed}
}

// inUse reports whether anything uses the session now.
func (u *sessionUse) inUse() bool { return u.cmds > 0 || u.excl }

// sessionNet is what a session's network between commands is made of:
// its profile's network under its lock (policy.SessionNetwork) and the
// limit its last command asked for, with the audit hook of the request
// whose records its network's events are. A reload re-decides it.
type sessionNet struct {
	last  *policy.NetLimit
	audit func(netstack.Record)
}

// newSession makes the session of rec, owned by its creator alone
// until it gives it up (give) or runs its first command in it (share).
func newSession(rec sessionRecord) *session {
	rec.Version = sessionRecordVersion
	return &session{sessionRecord: rec, sid: newRequestID(),
		use: newSessionUse(true, time.Now()), ended: make(chan struct{})}
}

// newSessionRecord is the record of a new session key of caller id, as
// verdict v and its VM's shape make it, running from now.
func newSessionRecord(key sessionKey, id policy.Identity, v policy.Verdict, shape vm.Shape, now time.Time) sessionRecord {
	id.PID = 0 // the creating request's process, not the session's
	return sessionRecord{Owner: key.owner, Name: key.name, Caller: id, Profile: v.Profile, Created: now,
		Idle: v.Limits.SessionIdle, Max: v.Limits.SessionMax, Paused: v.Limits.Paused, Shape: shape, State: stateRunning}
}

// errSessionEnded reports a session that ended while a request waited
// for it: the request starts a new one.
var errSessionEnded = errors.New("session ended")

// take waits until no command or operation uses the session, at most
// wait and while ctx lasts, and makes the caller its only user: a pause,
// a resume, a fork, a network lock, the daemon's stop.
func (ss *session) take(ctx context.Context, wait time.Duration) error {
	ss.mu.Lock()
	ss.use.wantExcl++
	close(ss.use.yield)
	ss.use.yield = make(chan struct{})
	ss.mu.Unlock()
	defer func() {
		ss.mu.Lock()
		ss.use.wantExcl--
		ss.signalLocked() // commands held back behind it may go
		ss.mu.Unlock()
	}()
	return ss.await(ctx, wait, func() (bool, error) {
		if ss.use.inUse() {
			return false, nil
		}
		ss.use.excl = true
		return true, nil
	}, func() error {
		what := "another operation"
		if n := ss.use.cmds; n > 0 {
			what = fmt.Sprintf("%d %s", n, plural(n, "command", "commands"))
		}
		return &RequestError{Kind: ErrSessionBusy, Msg: fmt.Sprintf("session %q still runs %s after %v: this waits for them; nothing was done", ss.Name, what, wait)}
	})
}

// share waits until the session can take one more command (fewer than
// max run in it, and no operation owns it or waits to), at most wait and
// while ctx lasts, and counts the caller's command in.
func (ss *session) share(ctx context.Context, wait time.Duration, max int) error {
	return ss.await(ctx, wait, func() (bool, error) {
		if ss.use.excl || ss.use.wantExcl > 0 || ss.use.cmds >= max {
			return false, nil
		}
		ss.use.cmds++
		return true, nil
	}, func() error {
		if ss.use.cmds >= max {
			return &RequestError{Kind: ErrSessionBusy, Rule: "sessions.max_commands",
				Msg: fmt.Sprintf("session %q still runs %d commands after %v, the most its profile runs at once (sessions.max_commands = %d)", ss.Name, ss.use.cmds, wait, max)}
		}
		return &RequestError{Kind: ErrSessionBusy, Msg: fmt.Sprintf("session %q is still being paused, resumed or forked after %v", ss.Name, wait)}
	})
}

// await waits, at most wait and while ctx lasts, until try (under
// ss.mu) succeeds; busy (under ss.mu) is the error of a wait that timed
// out. An ended session is errSessionEnded.
func (ss *session) await(ctx context.Context, wait time.Duration, try func() (bool, error), busy func() error) error {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		ss.mu.Lock()
		if ss.State == stateEnded {
			ss.mu.Unlock()
			return errSessionEnded
		}
		if ok, err := try(); ok || err != nil {
			ss.mu.Unlock()
			return err
		}
		free := ss.use.free
		ss.mu.Unlock()
		select {
		case <-free:
		case <-ss.ended:
		case <-t.C:
			ss.mu.Lock()
			defer ss.mu.Unlock()
			return busy()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// watchCtx returns a context of ctx's that ends, with the cause
// errYielded, when an operation starts waiting to own the session alone
// (see sessionUse.yield).
func (ss *session) watchCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ss.mu.Lock()
	yield := ss.use.yield
	ss.mu.Unlock()
	wctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-yield:
			cancel(errYielded)
		case <-wctx.Done():
		}
	}()
	return wctx, func() { cancel(nil) }
}

// yielded reports whether ctx (of watchCtx) ended for an operation.
func yielded(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errYielded) }

// errYielded ends a watch that let a pause, a resume or a fork go first.
var errYielded = errors.New("the session is being paused, resumed or forked")

// tryTake makes the caller the session's only user if nothing uses it
// now.
func (ss *session) tryTake() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.State == stateEnded || ss.use.inUse() || ss.use.wantExcl > 0 {
		return false
	}
	ss.use.excl = true
	return true
}

// give ends the caller's sole use; used says whether that counts as use
// of the session (an automatic pause that did not happen does not: the
// session still reaches its idle timeout).
func (ss *session) give(used bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.use.excl = false
	ss.endUseLocked(used)
}

// unshare ends one command's use.
func (ss *session) unshare(used bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.use.cmds--
	ss.endUseLocked(used)
}

// toShared turns the caller's sole use into one command's (a session it
// made or resumed for its command).
func (ss *session) toShared() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.use.excl = false
	ss.use.cmds++
	ss.signalLocked()
}

// endUseLocked records the end of a use. Precondition: ss.mu held.
func (ss *session) endUseLocked(used bool) {
	if used {
		ss.use.lastUsed = time.Now()
	}
	ss.signalLocked()
}

// signalLocked wakes whoever waits for the session. Precondition: ss.mu
// held.
func (ss *session) signalLocked() {
	close(ss.use.free)
	ss.use.free = make(chan struct{})
}

// whenIdle has the reaper run f (in a goroutine of its own) at its first
// round (once a second) that finds the session not in use: after the
// operation that owns it now has ended.
func (ss *session) whenIdle(f func()) {
	ss.mu.Lock()
	ss.use.idleWork = append(ss.use.idleWork, f)
	ss.mu.Unlock()
}

// touch records a use of the session now that no operation owns: bytes
// its published ports carried.
func (ss *session) touch() {
	ss.mu.Lock()
	ss.use.lastUsed = time.Now()
	ss.mu.Unlock()
}

// state is the session's state now.
func (ss *session) state() sessionState {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.State
}

// running returns the session's VM, or nil when it is not running.
func (ss *session) running() *vm.VM {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.State != stateRunning {
		return nil
	}
	return ss.vm
}

// record is a copy of the session's record as it is now.
// kit is what ss holds of its secrets (nil: none).
func (ss *session) kit() *secretKit {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.Secrets
}

func (ss *session) record() sessionRecord {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.sessionRecord
}

// end makes the session ended, once: it returns what it held (its VM and
// slot, or its save point) for the caller to release; ok is false when
// it had ended already.
func (ss *session) end() (v *vm.VM, slot func(), sp *vm.SavePoint, ok bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.State == stateEnded {
		return nil, nil, nil, false
	}
	ss.State = stateEnded
	close(ss.ended)
	v, slot, sp = ss.vm, ss.slot, ss.sp
	ss.vm, ss.slot, ss.sp = nil, nil, nil
	return v, slot, sp, true
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
	m := ss.Created.Add(ss.Max)
	if ss.State != stateRunning {
		return m
	}
	if e := ss.use.lastUsed.Add(ss.Idle); e.Before(m) {
		return e
	}
	return m
}

// pauseDueLocked reports whether a running, idle session is due for an
// automatic pause at now: idle for pause_after, or for idle_timeout when
// pause_after is set. Precondition: ss.mu held.
func (ss *session) pauseDueLocked(now time.Time) bool {
	after := ss.Paused.After
	if after <= 0 || ss.State != stateRunning || ss.use.inUse() || now.Before(ss.use.noPauseUntil) {
		return false
	}
	return !now.Before(ss.use.lastUsed.Add(min(after, ss.Idle)))
}

func (ss *session) info() wire.Session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := wire.Session{Name: ss.Name, Profile: ss.Profile, Image: ss.image(), Created: ss.Created, Ends: ss.Created.Add(ss.Max),
		LastUsed: ss.use.lastUsed, ExpiresAt: ss.expiryLocked(), Busy: ss.use.inUse(), Commands: ss.use.cmds, State: wire.SessionRunning, Parent: ss.Parent,
		NetLock: (*wire.NetLimit)(ss.NetLock)}
	for _, p := range ss.pubs {
		out.Published = append(out.Published, fmt.Sprintf("%s->%d", p.host, p.port))
	}
	if ss.State == stateRunning {
		out.VMID = ss.vm.ID
	} else {
		out.State, out.PausedAt = wire.SessionPaused, ss.PausedAt
		if ss.sp != nil {
			out.DiskBytes = ss.sp.Meta.DiskBytes()
		}
	}
	return out
}

// image is the name of the session's image: the one it began with (a
// record written before images could be chosen has its profile's image
// of then in its shape too).
func (ss *session) image() string { return ss.Shape.Normal().Image }

// plural is one or many by n.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
