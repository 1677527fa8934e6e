package gateway

// Sessions that last and branch. A running session can be paused to disk
// (a save point of its VM, package vm: RAM, device state and disk in
// STATE/sessions/ID/), which frees its VM and its slot; its next command
// resumes it. A session can be forked into copies, each a new session
// restored from one save point of it. Paused sessions outlive the daemon:
// each session's directory holds session.json, which says whether it is
// paused (and in which save point) or running; a start finds the paused
// ones again, and reports the ones that were running when the daemon died
// as lost (their VMs died with it), in the audit log and to their owner's
// next command.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/names"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

const (
	sessionsDir     = "sessions"
	lostDir         = "lost"
	forksDir        = "forks"
	sessionFileName = "session.json"
	sessionFileVer  = 1
)

func (s *Server) sessionDir(sid string) string {
	return filepath.Join(s.cfg.VM.StateDir, sessionsDir, sid)
}

// sessionFile is what a session's directory records of it.
type sessionFile struct {
	Version  int                 `json:"version"`
	Owner    string              `json:"owner"`
	Name     string              `json:"name"`
	Caller   policy.Identity     `json:"caller"`
	Profile  string              `json:"profile"`
	Created  time.Time           `json:"created"`
	Idle     time.Duration       `json:"idle_ns"`
	Max      time.Duration       `json:"max_ns"`
	Paused   policy.PausedLimits `json:"paused_limits"`
	Shape    vm.Shape            `json:"shape"`
	Parent   string              `json:"parent,omitempty"`
	State    string              `json:"state"`
	Save     string              `json:"save_point,omitempty"`
	PausedAt time.Time           `json:"paused_at,omitzero"`
	NetLock  *policy.NetLimit    `json:"net_lock,omitempty"`
}

// errSessionClosed is an operation's on a session that was ended while it
// ran (DELETE, its holder gone): the operation's results are undone.
var errSessionClosed = errors.New("the session was ended meanwhile")

// writeSession records ss as running, or paused in save point sp (a name
// in its directory), replacing the file atomically. A session ended
// meanwhile is not written again (its directory stays removed).
func (s *Server) writeSession(ss *session, state, sp string, pausedAt time.Time) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.closed {
		return fmt.Errorf("session file: %w", errSessionClosed)
	}
	dir := s.sessionDir(ss.sid)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	id := ss.id
	id.PID = 0
	f := sessionFile{Version: sessionFileVer, Owner: ss.key.owner, Name: ss.key.name, Caller: id, Profile: ss.profile, Created: ss.created,
		Idle: ss.idle, Max: ss.max, Paused: ss.limits, Shape: ss.shape, Parent: ss.parent, State: state, Save: sp, PausedAt: pausedAt,
		NetLock: ss.netLock}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, sessionFileName+".tmp")
	if err := writeSynced(tmp, append(b, '\n')); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, sessionFileName)); err != nil {
		return fmt.Errorf("session file: %w", err)
	}
	return nil
}

// rewriteSession records ss again as it is now: running, or paused.
// Precondition: the caller owns ss.
func (s *Server) rewriteSession(ss *session) error {
	ss.mu.Lock()
	state, sp, at := wire.SessionRunning, "", time.Time{}
	if ss.sp != nil {
		sp = filepath.Base(ss.sp.Dir)
	}
	if ss.vm == nil {
		state, at = wire.SessionPaused, ss.pausedAt
	}
	ss.mu.Unlock()
	return s.writeSession(ss, state, sp, at)
}

// writeSynced writes b to path (0600) and syncs it.
func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// lostSession is a session the daemon could not keep: its owner's next
// command on it is told, once. The note is a file (STATE/lost/SID.json),
// so that a restart, or a second one, does not turn it into a new, empty
// session silently.
type lostSession struct {
	Version int       `json:"version"`
	Owner   string    `json:"owner"`
	Name    string    `json:"name"`
	Why     string    `json:"why"`
	At      time.Time `json:"at"`
	file    string
}

// lostNoteLife is how long a lost note waits for its owner's next command
// on the name; older ones are removed at start.
const lostNoteLife = 30 * 24 * time.Hour

// loseSession ends a session that cannot go on, and keeps why for its
// owner's next command.
func (s *Server) loseSession(ss *session, why string) {
	s.noteLost(ss.key, ss.sid, why, time.Now())
	s.endLost(ss, why)
}

// endLost ends a lost session whose loss the command at hand is told.
func (s *Server) endLost(ss *session, why string) {
	s.metrics.sessionLost()
	s.destroySession(ss, "lost: "+why)
}

// noteLost keeps why the session key (sid) was lost for its owner's next
// command, on disk as well.
func (s *Server) noteLost(key sessionKey, sid, why string, at time.Time) {
	l := lostSession{Version: 1, Owner: key.owner, Name: key.name, Why: why, At: at,
		file: filepath.Join(s.cfg.VM.StateDir, lostDir, sid+".json")}
	b, err := json.Marshal(l)
	if err == nil {
		if err = os.MkdirAll(filepath.Dir(l.file), 0o700); err == nil {
			err = writeSynced(l.file, b)
		}
	}
	if err != nil {
		s.log.Error("keep a lost session's note: its owner is told until vmgated stops", "session", key.name, "err", err)
		l.file = ""
	}
	s.mu.Lock()
	if old, ok := s.lost[key]; ok && old.file != "" && old.file != l.file {
		_ = os.Remove(old.file)
	}
	s.lost[key] = l
	s.mu.Unlock()
}

// takeLost returns and forgets why the caller's session was lost, or "".
func (s *Server) takeLost(key sessionKey) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.lost[key]
	if !ok {
		return ""
	}
	delete(s.lost, key)
	if l.file != "" {
		if err := os.Remove(l.file); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("remove a lost session's note", "session", key.name, "err", err)
		}
	}
	return fmt.Sprintf("%s (at %s)", l.Why, l.At.UTC().Format(time.RFC3339))
}

// loadLost reads the lost notes a previous run left; notes older than
// lostNoteLife, or unreadable, are removed.
func (s *Server) loadLost(now time.Time) {
	dir := filepath.Join(s.cfg.VM.StateDir, lostDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Error("read the lost sessions' notes", "err", err)
		}
		return
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		var l lostSession
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &l)
		}
		switch {
		case err != nil || l.Version != 1 || !names.Session(l.Name) || l.Owner == "":
			s.log.Warn("removing an unreadable lost session's note", "file", p, "err", err)
			_ = os.Remove(p)
		case now.Sub(l.At) > lostNoteLife:
			s.log.Info("removing a lost session's note nobody asked for", "session", l.Name, "owner", l.Owner, "lost_at", l.At)
			_ = os.Remove(p)
		default:
			l.file = p
			s.lost[sessionKey{l.Owner, l.Name}] = l
		}
	}
}

// loadSessions finds the sessions the daemon's last run left: the paused
// ones are kept (no VM, no slot), the others were running when it died
// and are lost. What forks were being made is removed. It runs before the
// daemon serves.
func (s *Server) loadSessions() {
	s.loadLost(time.Now())
	forks := filepath.Join(s.cfg.VM.StateDir, forksDir)
	if ents, _ := os.ReadDir(forks); len(ents) > 0 {
		s.log.Warn("removing fork points a previous run left", "count", len(ents))
	}
	_ = os.RemoveAll(forks)
	dir := filepath.Join(s.cfg.VM.StateDir, sessionsDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Error("read the sessions directory", "err", err)
		}
		return
	}
	for _, e := range ents {
		ss, why := s.loadSession(e.Name())
		if ss == nil {
			continue
		}
		if why != "" {
			s.noteLost(ss.key, ss.sid, why, time.Now())
			s.metrics.sessionLost()
			_ = os.RemoveAll(s.sessionDir(e.Name()))
			rec := audit.Record{Kind: audit.KindSession, Session: ss.key.name, Profile: ss.profile, Message: "lost: " + why}
			setCaller(&rec, ss.id)
			_ = s.audit.Write(rec)
			s.log.Warn("session lost", "session", ss.key.name, "owner", ss.key.owner, "why", why)
			continue
		}
		s.sessions[ss.key] = ss
		s.log.Info("paused session found", "session", ss.key.name, "owner", ss.key.owner, "paused_at", ss.pausedAt, "disk_mib", ss.sp.Meta.DiskBytes()>>20)
	}
}

// loadSession reads one session's directory: the session, with why it is
// lost ("" when it is paused and whole); nil for a directory that names
// no session (removed).
func (s *Server) loadSession(sid string) (*session, string) {
	dir := s.sessionDir(sid)
	var f sessionFile
	b, err := os.ReadFile(filepath.Join(dir, sessionFileName))
	if err == nil {
		err = json.Unmarshal(b, &f)
	}
	if err != nil || f.Version != sessionFileVer || !names.Session(f.Name) || f.Owner != f.Caller.Key() {
		s.log.Warn("removing a session directory without a readable session", "dir", dir, "err", err)
		_ = os.RemoveAll(dir)
		return nil, ""
	}
	ss := &session{key: sessionKey{f.Owner, f.Name}, sid: sid, id: f.Caller, profile: f.Profile, shape: f.Shape, created: f.Created,
		idle: f.Idle, max: f.Max, limits: f.Paused, parent: f.Parent, lastUsed: f.PausedAt, pausedAt: f.PausedAt, netLock: f.NetLock,
		free: make(chan struct{}), ended: make(chan struct{})}
	if f.State != wire.SessionPaused {
		return ss, "vmgated stopped while it was running (its VM ended with the daemon)"
	}
	sp, err := vm.OpenSavePoint(filepath.Join(dir, f.Save))
	if err != nil {
		return ss, "its saved state cannot be read: " + err.Error()
	}
	ss.sp = sp
	return ss, ""
}

// shape is the VM shape of a verdict, as the host makes VMs (Normal: a
// session's shape compares equal to it).
func (s *Server) shape(v policy.Verdict) vm.Shape {
	mem, cpus := v.Limits.MemoryMiB, v.Limits.CPUs
	if mem == 0 {
		mem = vm.DefaultMemoryMiB
	}
	if cpus == 0 {
		cpus = vm.DefaultCPUs
	}
	return vm.Shape{Image: v.Image, MemoryMiB: mem, CPUs: cpus, DiskMiB: v.Limits.DiskMiB, Seccomp: s.seccompMode(), Network: v.Network != nil}.Normal()
}

// pauseBudget refuses a pause that would take the caller past its
// profile's paused sessions or their disk. The save point's size is not
// known before it is written: its bound (the RAM and the disk's changes)
// is what is counted.
func (s *Server) pauseBudget(ss *session, v *vm.VM, lim policy.PausedLimits) error {
	count, bytes := 0, int64(0)
	s.mu.Lock()
	for k, o := range s.sessions {
		if k.owner != ss.key.owner || o == ss {
			continue
		}
		o.mu.Lock()
		if o.vm == nil && o.sp != nil {
			count++
			bytes += o.sp.Meta.DiskBytes()
		}
		o.mu.Unlock()
	}
	s.mu.Unlock()
	need := int64(ss.shape.MemoryMiB)<<20 + v.DiskBytes()
	switch {
	case count >= lim.MaxCount:
		return &RequestError{Kind: ErrDenied, Profile: ss.profile, Rule: "sessions.max_paused",
			Msg: fmt.Sprintf("this caller has %d paused sessions, the most its profile allows (sessions.max_paused = %d); the session keeps running", count, lim.MaxCount)}
	case bytes+need > lim.MaxBytes:
		return &RequestError{Kind: ErrDenied, Profile: ss.profile, Rule: "sessions.max_paused_mib",
			Msg: fmt.Sprintf("pausing would take this caller's paused sessions to %d MiB (%d MiB now, up to %d MiB more), past its profile's %d MiB (sessions.max_paused_mib); the session keeps running",
				(bytes+need)>>20, bytes>>20, need>>20, lim.MaxBytes>>20)}
	}
	return nil
}

// pause saves the running session ss to disk and frees its VM and slot,
// within the caller's budget of paused sessions unless the daemon stops
// (the operator's stop pauses every session: the budget bounds what a
// caller keeps paused by its own request or idleness). On error the
// session keeps running, as it was.
//
// Precondition: the caller owns ss (take), which is running.
func (s *Server) pause(ctx context.Context, ss *session, why string, budget bool) error {
	ss.mu.Lock()
	v, release, old := ss.vm, ss.release, ss.sp
	ss.mu.Unlock()
	if budget {
		if err := s.pauseBudget(ss, v, ss.limits); err != nil {
			return err
		}
	}
	t0 := time.Now()
	name := "sp-" + newRequestID()[:8]
	sp, err := v.Save(ctx, filepath.Join(s.sessionDir(ss.sid), name), vm.SaveOptions{})
	if err == nil {
		if err = s.writeSession(ss, wire.SessionPaused, name, time.Now()); err != nil {
			_ = sp.Discard()
			if cerr := v.Continue(ctx); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}
	if err != nil {
		s.log.Warn("pause failed; the session keeps running", "session", ss.key.name, "err", vm.Details(err))
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("pause session %q: %s; the session keeps running", ss.key.name, clientMessage(err))}
	}
	now := time.Now()
	ss.mu.Lock()
	closed := ss.closed
	if !closed {
		ss.vm, ss.release, ss.sp, ss.pausedAt = nil, nil, sp, now
	}
	ss.mu.Unlock()
	if closed {
		// Its end took the VM and its slot.
		_ = sp.Discard()
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("pause session %q: %v", ss.key.name, errSessionClosed)}
	}
	ss.cutForwards("the session was paused")
	if err := v.Close(); err != nil {
		s.log.Error("close a paused session's vm", "session", ss.key.name, "err", err)
	}
	release()
	s.flushGated(s.netGate, v.ID)
	if old != nil {
		_ = old.Discard() // the save point it was resumed from
	}
	s.metrics.paused(time.Since(t0))
	rec := audit.Record{Kind: audit.KindSession, Session: ss.key.name, VMID: v.ID, Profile: ss.profile, Message: "paused: " + why,
		Snapshot: sp.Digest(), SnapshotBytes: sp.Meta.DiskBytes(), DurationMS: time.Since(t0).Milliseconds()}
	setCaller(&rec, ss.id)
	rec.PID = 0
	_ = s.audit.Write(rec)
	s.log.Info("session paused", "session", ss.key.name, "owner", ss.key.owner, "why", why, "ms", time.Since(t0).Milliseconds(),
		"disk_mib", sp.Meta.DiskBytes()>>20, "phases", fmt.Sprint(sp.Meta.Phases))
	return nil
}

// autoPause pauses an idle session the reaper found due, in the
// background, one at a time; a refusal (a budget) is not retried for a
// minute, and the session ends at its idle timeout if it is still not
// paused then. Precondition: the caller owns ss.
func (s *Server) autoPause(ss *session, now time.Time) {
	select {
	case s.pausing <- struct{}{}:
	default:
		ss.give() // another pause runs: the next round tries again
		return
	}
	go func() {
		defer func() { <-s.pausing }()
		defer ss.give()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		defer context.AfterFunc(s.execCtx, cancel)()
		if err := s.pause(ctx, ss, "idle", true); err != nil {
			ss.mu.Lock()
			ss.noPauseUntil = now.Add(time.Minute)
			ss.mu.Unlock()
			s.log.Warn("automatic pause refused", "session", ss.key.name, "err", err)
		}
	}()
}

// resume brings a paused session back: a VM slot (as a new VM takes one),
// its VM restored from its save point. A save point that cannot be
// restored (damaged, or saved on another machine: image, QEMU,
// accelerator, shape) loses the session, which is said; any other
// failure leaves it paused.
//
// Precondition: the caller owns ss, which is paused.
func (s *Server) resume(ctx context.Context, ss *session, st *execState) error {
	if want := s.shape(st.verdict); want != ss.shape.Normal() {
		why := fmt.Sprintf("its profile's machine changed since it was paused (%+v, now %+v)", ss.shape.Normal(), want)
		s.endLost(ss, why)
		return s.lostError(ss.key.name, why)
	}
	release, err := s.slots.acquire(ctx, s.claim(st))
	if err != nil {
		s.metrics.refusedBusy()
		return &RequestError{Kind: ErrBusy, Msg: fmt.Sprintf("resume session %q: %v", ss.key.name, err)}
	}
	ss.mu.Lock()
	sp := ss.sp
	ss.mu.Unlock()
	// Marked running before its VM starts: if the daemon dies now, the
	// session is lost, never resumed later into an older state.
	if err := s.writeSession(ss, wire.SessionRunning, filepath.Base(sp.Dir), time.Time{}); err != nil {
		release()
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("resume session %q: %v", ss.key.name, err)}
	}
	t0 := time.Now()
	v, err := s.host.Resume(ctx, sp, ss.shape, false)
	if err != nil {
		release()
		if errors.Is(err, vm.ErrSavePointDamaged) || errors.Is(err, vm.ErrSavePointStale) {
			s.log.Error("resume failed: the session is lost", "session", ss.key.name, "err", vm.Details(err))
			why := "cannot resume it: " + clientMessage(err)
			s.endLost(ss, why)
			return s.lostError(ss.key.name, why)
		}
		s.log.Warn("resume failed; the session stays paused", "session", ss.key.name, "err", vm.Details(err))
		if werr := s.writeSession(ss, wire.SessionPaused, filepath.Base(sp.Dir), ss.pausedAt); werr != nil {
			s.log.Error("session file", "session", ss.key.name, "err", werr)
		}
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("resume session %q: %s; it stays paused", ss.key.name, clientMessage(err))}
	}
	ss.mu.Lock()
	closed := ss.closed
	if !closed {
		ss.vm, ss.release, ss.pausedAt = v, release, time.Time{}
	}
	ss.mu.Unlock()
	if closed {
		_ = v.Close()
		release()
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("resume session %q: %v; this command did not run", ss.key.name, errSessionClosed)}
	}
	s.metrics.resumed(time.Since(t0))
	// The VM holds the RAM now; the save point stays as its disk's
	// backing, and its RAM file is removed once the session is idle
	// (DropRAMFile).
	remove := sp.DropRAMFile()
	ss.whenIdle(func() {
		if err := remove(); err != nil {
			s.log.Warn("free a resumed session's saved RAM", "session", ss.key.name, "err", err)
		}
	})
	rec := audit.Record{Kind: audit.KindSession, RequestID: st.reqID, Session: ss.key.name, VMID: v.ID, Profile: ss.profile, Message: "resumed",
		Snapshot: sp.Digest(), DurationMS: time.Since(t0).Milliseconds()}
	setCaller(&rec, st.id)
	_ = s.audit.Write(rec)
	s.log.Info("session resumed", "session", ss.key.name, "vm", v.ID, "ms", time.Since(t0).Milliseconds(), "phases", fmt.Sprint(v.Phases()))
	return nil
}

// lostError is what the command on a lost session is told.
func (s *Server) lostError(name, why string) *RequestError {
	return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("session %q was lost: %s; this command did not run, and the next one starts a new session", name, why)}
}

// claim is the VM slot claim of a request.
func (s *Server) claim(st *execState) slotClaim {
	v := st.verdict
	return slotClaim{profile: v.Profile, profileMax: v.Limits.MaxVMs, caller: st.id.Key(), callerMax: v.Limits.CallerVMs, callerQueue: v.Limits.CallerQueue}
}

// pauseAll pauses the running sessions at shutdown, two at a time, within
// the grace period; a session that cannot be paused in time ends (and is
// reported lost).
func (s *Server) pauseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Grace)
	defer cancel()
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, ss := range s.allSessions() {
		if err := ss.take(ctx, s.cfg.Grace); err != nil {
			s.loseSession(ss, "vmgated stopped while it was busy")
			continue
		}
		if ss.paused() {
			ss.give()
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := s.pause(ctx, ss, "vmgated stopped", false)
			ss.give()
			if err != nil {
				s.loseSession(ss, "vmgated stopped and could not pause it: "+err.Error())
			}
		}()
	}
	wg.Wait()
}

// fork makes the sessions of names copies of ss's state, each with a VM
// slot of its own (taken first: a fork the caller's limits do not allow is
// refused before anything is saved), a VM restored from one save point of
// ss (its RAM's unmodified pages shared), and ss's owner, profile, limits
// and network. ss keeps running (or stays paused).
//
// Precondition: the caller owns ss.
func (s *Server) fork(ctx context.Context, ss *session, st *execState, newNames []string) ([]wire.Session, error) {
	if err := s.checkForkNames(ss, newNames); err != nil {
		return nil, err
	}
	var slots []func()
	defer func() {
		for _, r := range slots {
			r()
		}
	}()
	for range newNames {
		r, err := s.slots.tryAcquire(s.claim(st))
		if err != nil {
			s.metrics.refusedBusy()
			return nil, &RequestError{Kind: ErrBusy, Msg: fmt.Sprintf("fork session %q into %d: %v; nothing was copied", ss.key.name, len(newNames), err)}
		}
		slots = append(slots, r)
	}
	t0 := time.Now()
	ss.mu.Lock()
	v, sp := ss.vm, ss.sp
	ss.mu.Unlock()
	if v != nil {
		// A running session is saved at this consistent point (no
		// command runs: the caller owns it) into a fork point its copies
		// share; it is removed with the last of them.
		dir := filepath.Join(s.cfg.VM.StateDir, forksDir, newRequestID())
		if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
			return nil, fmt.Errorf("fork: %w", err)
		}
		var err error
		if sp, err = v.Save(ctx, dir, vm.SaveOptions{Keep: true, InMemory: true}); err != nil {
			s.log.Warn("fork failed", "session", ss.key.name, "err", vm.Details(err))
			return nil, &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("fork session %q: %s; the session keeps running", ss.key.name, clientMessage(err))}
		}
		defer func() { _ = sp.Discard() }()
	} else {
		// The paused session's own save point: the copies keep the
		// sealed RAM they map, the daemon need not.
		defer sp.DropShared()
	}
	// The copies are restored forkParallel at a time: a restore waits on
	// QEMU's start and the guest's first steps, which a second one
	// overlaps.
	made := make([]*session, len(newNames))
	errs := make([]error, len(newNames))
	sem := make(chan struct{}, forkParallel)
	var wg sync.WaitGroup
	for i, name := range newNames {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			made[i], errs[i] = s.forkCopy(ctx, ss, st, sp, name, slots[i])
		})
	}
	wg.Wait()
	copies := make([]*session, 0, len(newNames))
	var left []func()
	for i, c := range made {
		if c != nil {
			copies = append(copies, c)
		} else {
			left = append(left, slots[i])
		}
	}
	slots = left // the slots of the copies made go with them
	if err := errors.Join(errs...); err != nil {
		for _, c := range copies {
			s.destroySession(c, "its fork failed")
		}
		s.log.Warn("fork failed", "session", ss.key.name, "err", vm.Details(err))
		return nil, &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("fork session %q: %s; no copy was made", ss.key.name, clientMessage(err))}
	}
	out := make([]wire.Session, 0, len(copies))
	children := make([]string, 0, len(copies))
	for _, c := range copies {
		c.give()
		out = append(out, c.info())
		children = append(children, c.key.name)
	}
	s.metrics.forked(len(copies), time.Since(t0))
	rec := audit.Record{Kind: audit.KindSession, RequestID: st.reqID, Session: ss.key.name, Profile: ss.profile, Message: "forked",
		Children: children, Snapshot: sp.Digest(), DurationMS: time.Since(t0).Milliseconds()}
	setCaller(&rec, st.id)
	_ = s.audit.Write(rec)
	s.log.Info("session forked", "session", ss.key.name, "copies", children, "ms", time.Since(t0).Milliseconds())
	return out, nil
}

// forkParallel is how many copies of a fork are restored at once.
const forkParallel = 2

// checkForkNames refuses names that are not session names, repeat, or
// name a session of the caller that exists.
func (s *Server) checkForkNames(ss *session, newNames []string) error {
	bad := func(format string, args ...any) error {
		return &RequestError{Kind: ErrBadRequest, Msg: "fork: " + fmt.Sprintf(format, args...)}
	}
	if len(newNames) == 0 || len(newNames) > wire.MaxForks {
		return bad("between 1 and %d names, got %d", wire.MaxForks, len(newNames))
	}
	seen := map[string]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range newNames {
		switch {
		case !names.Session(n):
			return bad("%q is not a session name (1 to %d of %s, not . or ..)", n, names.MaxLen, names.Charset)
		case seen[n]:
			return bad("%q is named twice", n)
		case s.sessions[sessionKey{ss.key.owner, n}] != nil:
			return bad("this caller already has a session %q", n)
		}
		seen[n] = true
	}
	return nil
}

// forkCopy makes one copy of a fork: a new session, owned by the caller
// (who gives it up once every copy is made), with a VM restored from sp.
func (s *Server) forkCopy(ctx context.Context, parent *session, st *execState, sp *vm.SavePoint, name string, slot func()) (*session, error) {
	v, err := s.host.Resume(ctx, sp, parent.shape, true)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	c := newSession(sessionKey{parent.key.owner, name}, parent.id, st.verdict, parent.shape, now)
	c.profile, c.idle, c.max, c.limits, c.parent = parent.profile, parent.idle, parent.max, parent.limits, parent.key.name
	// A copy's state is as old as its parent's: max_lifetime counts from
	// the parent's start, or forks would keep a state past it.
	c.created = parent.created
	parent.mu.Lock()
	c.egress, c.netLock = parent.egress, parent.netLock // a copy is locked as its parent is
	parent.mu.Unlock()
	c.vm, c.release = v, slot
	if n := v.Network(); n != nil && c.egress != nil {
		n.SetPolicy(netstack.Policy{Egress: *c.egress, Audit: s.netAudit(st, v.ID)})
	}
	if err := s.writeSession(c, wire.SessionRunning, "", time.Time{}); err != nil {
		_ = v.Close()
		_ = os.RemoveAll(s.sessionDir(c.sid))
		return nil, err
	}
	s.mu.Lock()
	if s.sessions[c.key] != nil {
		s.mu.Unlock()
		_ = v.Close()
		_ = os.RemoveAll(s.sessionDir(c.sid))
		return nil, fmt.Errorf("a session %q was made meanwhile", name)
	}
	s.sessions[c.key] = c
	s.mu.Unlock()
	rec := audit.Record{Kind: audit.KindSession, RequestID: st.reqID, Session: name, VMID: v.ID, Profile: c.profile,
		Message: "created: a fork of " + parent.key.name, Parent: parent.key.name, Snapshot: sp.Digest()}
	setCaller(&rec, st.id)
	_ = s.audit.Write(rec)
	return c, nil
}
