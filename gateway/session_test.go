package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// TestWhenIdle: work a session's operation leaves for later (a resumed
// session's old RAM file) is run by the reaper once the session is not in
// use, once, and never while a command holds it.
func TestWhenIdle(t *testing.T) {
	now := time.Now()
	key := sessionKey{"uid:1000", "s"}
	ss := newSession(newSessionRecord(key, policy.Identity{}, policy.Verdict{}, vm.Shape{}, now))
	ss.Idle, ss.Max = time.Hour, time.Hour // neither expired nor due
	s := &sessions{table: map[sessionKey]*session{key: ss}}
	ran := make(chan struct{}, 2)
	ss.whenIdle(func() { ran <- struct{}{} }) // ss is busy: newSession gives it to its creator
	pending := func() int {
		ss.mu.Lock()
		defer ss.mu.Unlock()
		return len(ss.use.idleWork)
	}
	s.reap(now)
	if n := pending(); n != 1 {
		t.Fatalf("a round while the session is in use took its work (%d left)", n)
	}
	ss.give(true)
	s.reap(now)
	if n := pending(); n != 0 {
		t.Fatalf("a round while the session is idle left %d of its work", n)
	}
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("the work did not run once the session was idle")
	}
	s.reap(now)
	if len(ran) != 0 {
		t.Error("the work ran twice")
	}
}

// TestSkippedPauseIsNoUse: an automatic pause that is skipped (another
// runs) is no use of the session: it still ends at its idle timeout.
// Before, the skip gave the session back as used, and a session due for a
// pause while another ran was never idle.
func TestSkippedPauseIsNoUse(t *testing.T) {
	key := sessionKey{"uid:1000", "s"}
	last := time.Now().Add(-time.Minute)
	ss := newSession(newSessionRecord(key, policy.Identity{}, policy.Verdict{}, vm.Shape{}, last))
	ss.Idle, ss.Max, ss.Paused.After = 2*time.Minute, time.Hour, 30*time.Second
	ss.use.lastUsed = last
	ss.give(false)
	x := &sessions{table: map[sessionKey]*session{key: ss}, pausing: make(chan struct{}, 1)}
	x.pausing <- struct{}{} // another pause runs
	x.reap(time.Now())
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.use.inUse() || !ss.use.lastUsed.Equal(last) {
		t.Errorf("after a skipped pause: busy %v, last used %v (was %v)", ss.use.inUse(), ss.use.lastUsed, last)
	}
}

// TestPauseBudgetReserves: pauses of one owner's sessions made at once
// each count the others under way, so that together they cannot pass the
// owner's budget; a reservation's end frees its room, and another owner's
// budget is its own.
func TestPauseBudgetReserves(t *testing.T) {
	lim := policy.PausedLimits{MaxCount: 1, MaxBytes: 1 << 30}
	mk := func(owner, name string) *session {
		ss := newSession(newSessionRecord(sessionKey{owner, name}, policy.Identity{}, policy.Verdict{}, vm.Shape{MemoryMiB: 256}, time.Now()))
		return ss
	}
	a, b, c := mk("uid:1000", "a"), mk("uid:1000", "b"), mk("uid:1001", "c")
	x := &sessions{table: map[sessionKey]*session{a.key(): a, b.key(): b, c.key(): c}, reserved: map[string]pauseReserved{}}
	v := &vm.VM{}
	release, err := x.pauseBudget(a, v, lim)
	if err != nil {
		t.Fatalf("the first pause: %v", err)
	}
	if _, err := x.pauseBudget(b, v, lim); err == nil || !strings.Contains(err.Error(), "sessions.max_paused") {
		t.Errorf("a second pause while the first is under way: %v", err)
	}
	if r, err := x.pauseBudget(c, v, lim); err != nil {
		t.Errorf("another owner's pause: %v", err)
	} else {
		r()
	}
	release()
	release() // once
	if r, err := x.pauseBudget(b, v, lim); err != nil {
		t.Errorf("a pause after the first's reservation ended: %v", err)
	} else {
		r()
	}
	if len(x.reserved) != 0 {
		t.Errorf("reservations left: %v", x.reserved)
	}
	// A session resumed from a save point saves that one's disk again:
	// its size counts.
	small := policy.PausedLimits{MaxCount: 4, MaxBytes: 300 << 20}
	a.sp = &vm.SavePoint{Meta: vm.SavePointMeta{OverlayBytes: 100 << 20}}
	if _, err := x.pauseBudget(a, v, small); err == nil || !strings.Contains(err.Error(), "sessions.max_paused_mib") {
		t.Errorf("a resumed session's pause past the disk budget: %v", err)
	}
}

// TestSessionUse: commands share a session up to max at once, the next
// waits and is refused naming sessions.max_commands; an operation that
// owns it alone (a pause) waits for the commands, and commands that come
// while it waits wait behind it.
func TestSessionUse(t *testing.T) {
	ctx := context.Background()
	ss := newSession(newSessionRecord(sessionKey{"uid:1", "s"}, policy.Identity{}, policy.Verdict{}, vm.Shape{}, time.Now()))
	ss.give(true) // made: nobody uses it now
	for range 2 {
		if err := ss.share(ctx, time.Second, 2); err != nil {
			t.Fatal(err)
		}
	}
	err := ss.share(ctx, 100*time.Millisecond, 2)
	var rerr *RequestError
	if !errors.As(err, &rerr) || rerr.Kind != ErrSessionBusy || rerr.Rule != "sessions.max_commands" || !strings.Contains(rerr.Msg, "sessions.max_commands = 2") {
		t.Fatalf("a third command of two at most: %v", err)
	}
	if err := ss.take(ctx, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "still runs 2 commands") {
		t.Fatalf("a pause while two commands run: %v", err)
	}
	took := make(chan error, 1)
	go func() { took <- ss.take(ctx, 10*time.Second) }()
	waitUntil(t, func() bool { ss.mu.Lock(); defer ss.mu.Unlock(); return ss.use.wantExcl == 1 })
	if err := ss.share(ctx, 100*time.Millisecond, 8); err == nil {
		t.Fatal("a command went ahead of a waiting pause")
	}
	ss.unshare(true)
	ss.unshare(true)
	if err := <-took; err != nil {
		t.Fatalf("the pause once the commands ended: %v", err)
	}
	if ss.tryTake() {
		t.Fatal("two sole owners")
	}
	ss.toShared() // it resumed the session for its command
	if err := ss.share(ctx, time.Second, 8); err != nil {
		t.Fatalf("a command beside the resumer's: %v", err)
	}
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("waited 10 s")
		}
	}
}

// TestSessionWatchYields: a call that only watches a process (a logs
// follow, a wait) lets go when a pause or a fork starts to wait for the
// session, so the pause gets it; commands coming and going do not end a
// watch.
func TestSessionWatchYields(t *testing.T) {
	ctx := context.Background()
	ss := newSession(newSessionRecord(sessionKey{"uid:1", "s"}, policy.Identity{}, policy.Verdict{}, vm.Shape{}, time.Now()))
	ss.give(true)
	if err := ss.share(ctx, time.Second, 4); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := ss.watchCtx(ctx)
	defer cancel()
	go func() { <-wctx.Done(); ss.unshare(true) }() // the watch ends its use when it ends
	if err := ss.share(ctx, time.Second, 4); err != nil {
		t.Fatal(err)
	}
	ss.unshare(true)
	select {
	case <-wctx.Done():
		t.Fatal("a command's use ended a watch")
	case <-time.After(50 * time.Millisecond):
	}
	if err := ss.take(ctx, 5*time.Second); err != nil {
		t.Fatalf("a pause while a watch holds the session: %v", err)
	}
	if !yielded(wctx) {
		t.Fatalf("the watch ended with %v, want errYielded", context.Cause(wctx))
	}
	ss.give(true)
	// A watch begun after the pause is not ended by it.
	if err := ss.share(ctx, time.Second, 4); err != nil {
		t.Fatal(err)
	}
	later, cancel2 := ss.watchCtx(ctx)
	defer cancel2()
	if later.Err() != nil {
		t.Fatal("a new watch began ended")
	}
}

// TestLoadedSessionUse: a session read back from the state directory (a
// paused one, or one lost with the daemon) is used as a new one is: a
// pause or an end may take it, and its watches let go.
func TestLoadedSessionUse(t *testing.T) {
	x := &sessions{stateDir: t.TempDir(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	rec := newSessionRecord(sessionKey{"uid:1", "s"}, policy.Identity{UID: 1}, policy.Verdict{}, vm.Shape{}, time.Now())
	rec.Owner, rec.Version = rec.Caller.Key(), sessionRecordVersion
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(x.dir("sid1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(x.dir("sid1"), sessionFileName), b, 0o600); err != nil {
		t.Fatal(err)
	}
	ss, why := x.loadOne("sid1")
	if ss == nil || why == "" {
		t.Fatalf("loadOne: %v %q, want the session, lost", ss, why)
	}
	ctx := context.Background()
	if err := ss.share(ctx, time.Second, 2); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := ss.watchCtx(ctx)
	defer cancel()
	go func() { <-wctx.Done(); ss.unshare(true) }()
	if err := ss.take(ctx, 5*time.Second); err != nil {
		t.Fatalf("take a loaded session: %v", err)
	}
	if !yielded(wctx) {
		t.Fatal("a loaded session's watch did not let go")
	}
}
