package gateway

import (
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
	ss := newSession(newSessionRecord(key, policy.Identity{}, policy.Verdict{}, vm.Shape{}, now), nil)
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
