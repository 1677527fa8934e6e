package gateway

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSlots_PerCaller: a caller at its share waits (and is refused when
// its share of the queue is full) while another caller is served at once.
func TestSlots_PerCaller(t *testing.T) {
	s := newSlots(4, 8, 50*time.Millisecond)
	ctx := context.Background()
	a := slotClaim{profile: "p", profileMax: 4, caller: "uid:1", callerMax: 2, callerQueue: 1}
	b := a
	b.caller = "uid:2"
	var rel []func()
	for range 2 {
		r, err := s.acquire(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		rel = append(rel, r)
	}
	// a's third waits and times out; b is served meanwhile.
	done := make(chan error, 1)
	go func() {
		_, err := s.acquire(ctx, a)
		done <- err
	}()
	for _, waiting := s.stats(); waiting == 0; _, waiting = s.stats() {
		time.Sleep(time.Millisecond)
	}
	if _, err := s.acquire(ctx, a); !errors.Is(err, ErrBusy) {
		t.Fatalf("a's fourth, beyond its queue share: %v, want busy at once", err)
	}
	rb, err := s.acquire(ctx, b)
	if err != nil {
		t.Fatalf("another caller: %v", err)
	}
	if err := <-done; !errors.Is(err, ErrBusy) {
		t.Fatalf("a's third: %v, want busy after the wait", err)
	}
	// A release of a's makes room for a again.
	rel[0]()
	r, err := s.acquire(ctx, a)
	if err != nil {
		t.Fatalf("a after a release of its own: %v", err)
	}
	r()
	rel[1]()
	rb()
	rel[0]() // twice: no effect
	if used, waiting := s.stats(); used != 0 || waiting != 0 || len(s.caller) != 0 || len(s.queued) != 0 {
		t.Fatalf("after all releases: used %d, waiting %d, callers %v, queued %v", used, waiting, s.caller, s.queued)
	}
}
