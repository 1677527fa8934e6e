package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/names"
	"github.com/vmgate/vmgate/vm"
)

// forkParallel is how many copies of a fork are restored at once.
const forkParallel = 2

// fork makes the sessions of newNames copies of ss's state, each with a
// VM slot of its own (taken first: a fork the caller's limits do not
// allow is refused before anything is saved), a VM restored from one save
// point of ss (its RAM's unmodified pages shared), and ss's owner,
// profile, limits and network. ss keeps running (or stays paused).
//
// Precondition: the caller owns ss.
func (x *sessions) fork(ctx context.Context, ss *session, q *request, newNames []string) ([]wire.Session, error) {
	if err := x.checkForkNames(ss, newNames); err != nil {
		return nil, err
	}
	var slots []func()
	defer func() {
		for _, r := range slots {
			r()
		}
	}()
	for range newNames {
		r, err := x.slots.tryAcquire(claim(q))
		if err != nil {
			x.rec.metrics.refusedBusy()
			return nil, &RequestError{Kind: ErrBusy, Msg: fmt.Sprintf("fork session %q into %d: %v; nothing was copied", ss.Name, len(newNames), err)}
		}
		slots = append(slots, r)
	}
	t0 := time.Now()
	sp, release, err := x.forkPoint(ctx, ss)
	if err != nil {
		return nil, err
	}
	defer release()
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
			made[i], errs[i] = x.forkCopy(ctx, ss, q, sp, name, slots[i])
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
			x.destroy(c, "its fork failed")
		}
		x.log.Warn("fork failed", "session", ss.Name, "err", vm.Details(err))
		return nil, forkFailure(ss.Name, err)
	}
	out := make([]wire.Session, 0, len(copies))
	children := make([]string, 0, len(copies))
	for _, c := range copies {
		c.give(true)
		out = append(out, c.info())
		children = append(children, c.Name)
	}
	x.rec.metrics.forked(len(copies), time.Since(t0))
	x.audit(ss, q, audit.Record{Message: "forked", Children: children, Snapshot: sp.Digest(), DurationMS: since(t0)})
	x.log.Info("session forked", "session", ss.Name, "copies", children, "ms", since(t0))
	return out, nil
}

// forkFailure is what the caller of a fork of session name is told when
// a copy failed (err joins the copies' errors): session busy when another
// request took a copy's name meanwhile, else the VM's failure.
func forkFailure(name string, err error) *RequestError {
	var re *RequestError
	if errors.As(err, &re) && re.Kind == ErrSessionBusy {
		return &RequestError{Kind: ErrSessionBusy, Msg: fmt.Sprintf("fork session %q: %s; no copy was made", name, re.Msg)}
	}
	return &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("fork session %q: %s; no copy was made", name, clientMessage(err))}
}

// forkPoint is the save point ss's copies are restored from, and what
// to do once they are: a running session is saved at this consistent
// point (no command runs: the caller owns it) into a fork point its copies
// share, removed with the last of them; a paused session's own save point
// serves, and the sealed RAM the copies map is theirs to keep.
func (x *sessions) forkPoint(ctx context.Context, ss *session) (*vm.SavePoint, func(), error) {
	ss.mu.Lock()
	v, sp := ss.vm, ss.sp
	if ss.State != stateRunning {
		v = nil
	}
	ss.mu.Unlock()
	if v == nil {
		return sp, sp.DropShared, nil
	}
	dir := filepath.Join(x.stateDir, forksDir, newRequestID())
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, nil, fmt.Errorf("fork: %w", err)
	}
	sp, err := v.Save(ctx, dir, vm.SaveOptions{Keep: true, InMemory: true})
	if err != nil {
		x.log.Warn("fork failed", "session", ss.Name, "err", vm.Details(err))
		return nil, nil, &RequestError{Kind: ErrVMFailed, Msg: fmt.Sprintf("fork session %q: %s; the session keeps running", ss.Name, clientMessage(err))}
	}
	return sp, func() { _ = sp.Discard() }, nil
}

// checkForkNames refuses names that are not session names or repeat, and
// (as session busy) names of the caller's sessions that exist.
func (x *sessions) checkForkNames(ss *session, newNames []string) error {
	bad := func(format string, args ...any) error {
		return &RequestError{Kind: ErrBadRequest, Msg: "fork: " + fmt.Sprintf(format, args...)}
	}
	if len(newNames) == 0 || len(newNames) > wire.MaxForks {
		return bad("between 1 and %d names, got %d", wire.MaxForks, len(newNames))
	}
	seen := map[string]bool{}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, n := range newNames {
		switch {
		case !names.Session(n):
			return bad("%q is not a session name (%s)", n, names.SessionRule)
		case seen[n]:
			return bad("%q is named twice", n)
		case x.table[sessionKey{ss.Owner, n}] != nil:
			return bad("this caller already has a session %q", n)
		}
		seen[n] = true
	}
	return nil
}

// forkCopy makes one copy of a fork: a new session, owned by the caller
// (who gives it up once every copy is made), with a VM restored from sp,
// and its parent's owner, profile, limits, network and lock. A copy's
// state is as old as its parent's: max_lifetime counts from the parent's
// start, or forks would keep a state past it.
func (x *sessions) forkCopy(ctx context.Context, parent *session, q *request, sp *vm.SavePoint, name string, slot func()) (*session, error) {
	v, err := x.host.Resume(ctx, sp, parent.Shape, true)
	if err != nil {
		return nil, err
	}
	rec := parent.record()
	rec.Name, rec.Parent, rec.State, rec.Save, rec.PausedAt = name, parent.Name, stateRunning, "", time.Time{}
	parent.mu.Lock()
	last := parent.net.last
	parent.mu.Unlock()
	c := newSession(rec)
	c.vm, c.slot = v, slot
	// The copy's network is decided under the policy in force now, not
	// copied from its parent's last command: the copy's processes use it
	// at once.
	c.net = sessionNet{last: last, audit: x.rec.netHook(q, v.ID)}
	e, _ := q.policy.SessionNetwork(q.id, rec.NetLock, last)
	x.setNetwork(v, e, c.net.audit, rec.Secrets, q.policy.SessionSecrets(q.id, rec.Secrets.names()))
	if err := x.register(c, q, "created: a fork of "+parent.Name, audit.Record{Parent: parent.Name, Snapshot: sp.Digest()}); err != nil {
		_ = v.Close()
		return nil, err
	}
	// The copy's background processes are copies of its parent's, ended
	// (and audited) as the copy's.
	x.watchAll(c, v)
	return c, nil
}
