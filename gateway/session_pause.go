package gateway

// Pause and resume. A pause saves a running session's VM to a save point
// in its directory (its RAM, device state and disk) and frees its VM and
// slot; its next command resumes it into a new VM restored from the save
// point. The daemon's stop pauses every running session.

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// pauseBudget reserves a pause of ss (running in v) within its owner's
// budget of paused sessions (lim), or refuses it. The save point's size is
// not known before it is written: its bound is what is reserved, its RAM
// and its whole disk (a session resumed from a save point saves that
// one's disk too, folded with its changes since). The reservation holds
// until release; pauses of one owner's sessions made at once each see the
// others' reservations.
func (x *sessions) pauseBudget(ss *session, v *vm.VM, lim policy.PausedLimits) (release func(), err error) {
	need := int64(ss.Shape.MemoryMiB)<<20 + v.DiskBytes()
	ss.mu.Lock()
	if ss.sp != nil {
		need += ss.sp.Meta.OverlayBytes
	}
	ss.mu.Unlock()
	x.mu.Lock()
	defer x.mu.Unlock()
	if err := x.checkBudgetLocked(ss, need, lim); err != nil {
		return nil, err
	}
	r := x.reserved[ss.Owner]
	r.count++
	r.bytes += need
	x.reserved[ss.Owner] = r
	var once sync.Once
	return func() {
		once.Do(func() {
			x.mu.Lock()
			defer x.mu.Unlock()
			r := x.reserved[ss.Owner]
			r.count--
			r.bytes -= need
			if r.count == 0 {
				delete(x.reserved, ss.Owner)
			} else {
				x.reserved[ss.Owner] = r
			}
		})
	}, nil
}

// pauseReserved is what an owner's pauses under way will hold.
type pauseReserved struct {
	count int
	bytes int64
}

// checkBudgetLocked refuses a pause of ss that would hold need bytes when
// its owner's paused sessions and pauses under way (its own excluded)
// leave no room for it under lim. Precondition: x.mu held.
func (x *sessions) checkBudgetLocked(ss *session, need int64, lim policy.PausedLimits) error {
	r := x.reserved[ss.Owner]
	count, bytes := r.count, r.bytes
	for _, o := range x.table {
		if o.Owner != ss.Owner || o == ss {
			continue
		}
		o.mu.Lock()
		if o.State == statePaused && o.sp != nil {
			count++
			bytes += o.sp.Meta.DiskBytes()
		}
		o.mu.Unlock()
	}
	switch {
	case count >= lim.MaxCount:
		return &RequestError{Kind: ErrDenied, Profile: ss.Profile, Rule: "sessions.max_paused",
			Msg: fmt.Sprintf("this caller has %d paused sessions (pauses under way included), the most its profile allows (sessions.max_paused = %d); the session keeps running", count, lim.MaxCount)}
	case bytes+need > lim.MaxBytes:
		return &RequestError{Kind: ErrDenied, Profile: ss.Profile, Rule: "sessions.max_paused_mib",
			Msg: fmt.Sprintf("pausing would take this caller's paused sessions to %d MiB (%d MiB now, up to %d MiB more), past its profile's %d MiB (sessions.max_paused_mib); the session keeps running",
				(bytes+need)>>20, bytes>>20, need>>20, lim.MaxBytes>>20)}
	}
	return nil
}

// recheckBudget checks a pause of ss again with the size of its save
// point sp, once written, against what its owner's other sessions hold
// and reserve now.
func (x *sessions) recheckBudget(ss *session, sp *vm.SavePoint, lim policy.PausedLimits, release func()) error {
	release()
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.checkBudgetLocked(ss, sp.Meta.DiskBytes(), lim)
}

// pause saves the running session ss to disk and frees its VM and slot,
// within the caller's budget of paused sessions unless the daemon stops
// (the operator's stop pauses every session: the budget bounds what a
// caller keeps paused by its own request or idleness). On error the
// session keeps running, as it was.
//
// Precondition: the caller owns ss (take), which is running.
func (x *sessions) pause(ctx context.Context, ss *session, why string, budget bool) error {
	ss.mu.Lock()
	v, slot, old, limits := ss.vm, ss.slot, ss.sp, ss.Paused
	ss.mu.Unlock()
	release := func() {}
	if budget {
		var err error
		if release, err = x.pauseBudget(ss, v, limits); err != nil {
			return err
		}
	}
	defer release()
	t0 := time.Now()
	name := newSaveName()
	sp, err := v.Save(ctx, filepath.Join(x.dir(ss.sid), name), vm.SaveOptions{})
	if err == nil && budget {
		if err = x.recheckBudget(ss, sp, limits, release); err != nil {
			_ = sp.Discard()
			if cerr := v.Continue(ctx); cerr != nil {
				x.log.Warn("pause refused after its save; the session could not run again", "session", ss.Name, "err", cerr)
				err = errors.Join(err, cerr)
			} else {
				return err
			}
		}
	}
	if err == nil {
		if err = x.store(ss, func(r *sessionRecord) { r.State, r.Save, r.PausedAt = statePaused, name, time.Now() }); err != nil {
			_ = sp.Discard()
			if cerr := v.Continue(ctx); cerr != nil {
				err = errors.Join(err, cerr)
			}
		}
	}
	if err != nil && v.Gone() {
		// Its VM could not run again (a guest that stopped its agent):
		// that session alone is lost.
		why := "it could not be paused, and its VM did not run again: " + clientMessage(err)
		x.log.Warn("pause failed: the session is lost", "session", ss.Name, "err", vm.Details(err))
		x.lose(ss, why)
		return lostError(ss.Name, why)
	}
	if err != nil {
		x.log.Warn("pause failed; the session keeps running", "session", ss.Name, "err", vm.Details(err))
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("pause session %q: %s; the session keeps running", ss.Name, clientMessage(err))}
	}
	ss.mu.Lock()
	ended := ss.State == stateEnded
	if !ended {
		ss.State, ss.Save, ss.PausedAt = statePaused, name, time.Now()
		ss.vm, ss.slot, ss.sp = nil, nil, sp
	}
	ss.mu.Unlock()
	if ended {
		// Its end took the VM and its slot.
		_ = sp.Discard()
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("pause session %q: %v", ss.Name, errSessionClosed)}
	}
	ss.cutForwards("the session was paused")
	if err := v.Close(); err != nil {
		x.log.Error("close a paused session's vm", "session", ss.Name, "err", err)
	}
	slot()
	x.rec.flushNet(v.ID)
	if old != nil {
		_ = old.Discard() // the save point it was resumed from
	}
	x.rec.metrics.paused(time.Since(t0))
	x.audit(ss, nil, audit.Record{VMID: v.ID, Message: "paused: " + why, Snapshot: sp.Digest(), SnapshotBytes: sp.Meta.DiskBytes(), DurationMS: since(t0)})
	x.log.Info("session paused", "session", ss.Name, "owner", ss.Owner, "why", why, "ms", since(t0),
		"disk_mib", sp.Meta.DiskBytes()>>20, "phases", fmt.Sprint(sp.Meta.Phases))
	return nil
}

// autoPause pauses an idle session the reaper found due, in the
// background, one at a time; a refusal (a budget) is not retried for a
// minute, and the session ends at its idle timeout if it is still not
// paused then. Precondition: the caller owns ss.
func (x *sessions) autoPause(ss *session, now time.Time) {
	// An automatic pause is no use of the session: one that is skipped or
	// refused leaves it as idle as it was, to end at its idle timeout.
	select {
	case x.pausing <- struct{}{}:
	default:
		ss.give(false) // another pause runs: the next round tries again
		return
	}
	l, rerr := x.core.enter(context.Background())
	if rerr != nil {
		<-x.pausing
		ss.give(false) // the daemon stops: it pauses every session
		return
	}
	go func() {
		defer l.end()
		defer func() { <-x.pausing }()
		defer ss.give(false)
		if err := x.pause(l.ctx, ss, "idle", true); err != nil {
			ss.mu.Lock()
			ss.use.noPauseUntil = now.Add(time.Minute)
			ss.mu.Unlock()
			x.log.Warn("automatic pause refused", "session", ss.Name, "err", err)
		}
	}()
}

// resume brings a paused session back for q: a VM slot (as a new VM
// takes one), its VM restored from its save point. A save point that
// cannot be restored (damaged, or saved on another machine: image, QEMU,
// accelerator, shape) loses the session, which is said; any other failure
// leaves it paused.
//
// Precondition: the caller owns ss, which is paused.
func (x *sessions) resume(ctx context.Context, ss *session, q *request) error {
	if want := x.core.shape(q.verdict); want != ss.Shape.Normal() {
		why := fmt.Sprintf("its profile's machine changed since it was paused (%+v, now %+v)", ss.Shape.Normal(), want)
		x.endLost(ss, why)
		return lostError(ss.Name, why)
	}
	slot, err := x.slots.acquire(ctx, claim(q))
	if err != nil {
		x.rec.metrics.refusedBusy()
		return &RequestError{Kind: ErrBusy, Msg: fmt.Sprintf("resume session %q: %v", ss.Name, err)}
	}
	ss.mu.Lock()
	sp := ss.sp
	ss.mu.Unlock()
	// Recorded running before its VM starts: if the daemon dies now, the
	// session is lost, never resumed later into an older state.
	if err := x.store(ss, func(r *sessionRecord) { r.State, r.PausedAt = stateRunning, time.Time{} }); err != nil {
		slot()
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("resume session %q: %v", ss.Name, err)}
	}
	t0 := time.Now()
	v, err := x.host.Resume(ctx, sp, ss.Shape, false)
	if err != nil {
		slot()
		if errors.Is(err, vm.ErrSavePointDamaged) || errors.Is(err, vm.ErrSavePointStale) {
			x.log.Error("resume failed: the session is lost", "session", ss.Name, "err", vm.Details(err))
			why := "cannot resume it: " + clientMessage(err)
			x.endLost(ss, why)
			return lostError(ss.Name, why)
		}
		x.log.Warn("resume failed; the session stays paused", "session", ss.Name, "err", vm.Details(err))
		if werr := x.store(ss, nil); werr != nil {
			x.log.Error("session file", "session", ss.Name, "err", werr)
		}
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("resume session %q: %s; it stays paused", ss.Name, clientMessage(err))}
	}
	ss.mu.Lock()
	ended := ss.State == stateEnded
	if !ended {
		ss.State, ss.PausedAt = stateRunning, time.Time{}
		ss.vm, ss.slot = v, slot
	}
	ss.mu.Unlock()
	if ended {
		_ = v.Close()
		slot()
		return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("resume session %q: %v; this command did not run", ss.Name, errSessionClosed)}
	}
	x.rec.metrics.resumed(time.Since(t0))
	x.watchAll(ss, v)
	// The VM holds the RAM now; the save point stays as its disk's
	// backing, and its RAM file is removed once the session is idle
	// (DropRAMFile).
	remove := sp.DropRAMFile()
	ss.whenIdle(func() {
		if err := remove(); err != nil {
			x.log.Warn("free a resumed session's saved RAM", "session", ss.Name, "err", err)
		}
	})
	x.audit(ss, q, audit.Record{VMID: v.ID, Message: "resumed", Snapshot: sp.Digest(), DurationMS: since(t0)})
	x.log.Info("session resumed", "session", ss.Name, "vm", v.ID, "ms", since(t0), "phases", fmt.Sprint(v.Phases()))
	return nil
}

// pauseAll pauses the running sessions at shutdown, two at a time, within
// the grace period; a session that cannot be paused in time ends (and is
// reported lost).
func (x *sessions) pauseAll() {
	ctx, cancel := context.WithTimeout(context.Background(), x.grace)
	defer cancel()
	sem := make(chan struct{}, 2)
	var wg sync.WaitGroup
	for _, ss := range x.all() {
		if err := ss.take(ctx, x.grace); err != nil {
			x.lose(ss, "vmgated stopped while it was busy")
			continue
		}
		if ss.state() != stateRunning {
			ss.give(false)
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := x.pause(ctx, ss, "vmgated stopped", false)
			ss.give(false)
			if err != nil && ss.state() != stateEnded {
				x.lose(ss, "vmgated stopped and could not pause it: "+err.Error())
			}
		}()
	}
	wg.Wait()
}
