package gateway

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// slots bounds live VMs globally, per profile and per caller within a
// profile, with a bounded FIFO-ish wait: at most queueLen requests wait,
// each at most wait, and at most a claim's callerQueue of them are one
// caller's. A caller at its limit waits for its own VMs to end, so that
// no caller can take every VM or queue place from the others.
type slots struct {
	mu       sync.Mutex
	max      int
	used     int
	profile  map[string]int
	caller   map[callerSlot]int // VMs held
	queued   map[callerSlot]int // requests waiting
	queueLen int
	waiting  int
	wait     time.Duration
	changed  chan struct{} // closed and replaced whenever a slot is released
}

// slotClaim is what one request asks of the slots: a VM of profile (of
// which profileMax may run), held by caller (callerMax of them, with
// callerQueue more waiting). A profileMax or callerMax of 0 means no
// bound; a callerQueue of 0, no waiting.
type slotClaim struct {
	profile                string
	profileMax             int
	caller                 string
	callerMax, callerQueue int
}

type callerSlot struct{ profile, caller string }

func newSlots(max, queueLen int, wait time.Duration) *slots {
	return &slots{max: max, queueLen: queueLen, wait: wait, profile: map[string]int{},
		caller: map[callerSlot]int{}, queued: map[callerSlot]int{}, changed: make(chan struct{})}
}

// busyError says which bound refused a request: no VM slot became free,
// the queue was full or the wait timed out. It is of kind ErrBusy.
type busyError struct{ why string }

func (e *busyError) Error() string { return "busy: " + e.why }
func (e *busyError) Unwrap() error { return ErrBusy }

func (s *slots) free(c slotClaim) bool {
	cs := callerSlot{c.profile, c.caller}
	return s.used < s.max && (c.profileMax <= 0 || s.profile[c.profile] < c.profileMax) &&
		(c.callerMax <= 0 || s.caller[cs] < c.callerMax)
}

// acquire takes one global slot, one of the claim's profile and one of
// its caller's. It returns a *busyError (ErrBusy) when the queue, or the
// caller's share of it, is full or no slot frees up in time.
func (s *slots) acquire(ctx context.Context, c slotClaim) (release func(), err error) {
	cs := callerSlot{c.profile, c.caller}
	deadline := time.NewTimer(s.wait)
	defer deadline.Stop()
	s.mu.Lock()
	queued := false
	unqueue := func() {
		if queued {
			s.waiting--
			if s.queued[cs]--; s.queued[cs] == 0 {
				delete(s.queued, cs)
			}
		}
	}
	for {
		if s.free(c) {
			s.used++
			s.profile[c.profile]++
			s.caller[cs]++
			unqueue()
			s.mu.Unlock()
			var once sync.Once
			return func() { once.Do(func() { s.release(cs) }) }, nil
		}
		if !queued {
			switch {
			case s.waiting >= s.queueLen:
				s.mu.Unlock()
				return nil, &busyError{fmt.Sprintf("all VM slots taken and the queue is full (%d waiting)", s.waiting)}
			case s.queued[cs] >= c.callerQueue:
				s.mu.Unlock()
				return nil, &busyError{fmt.Sprintf("this caller already has %d VMs of profile %q and %d requests waiting (max_queued_per_caller %d)", s.caller[cs], c.profile, s.queued[cs], c.callerQueue)}
			}
			s.waiting++
			s.queued[cs]++
			queued = true
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			s.mu.Lock()
			unqueue()
			s.mu.Unlock()
			return nil, &busyError{fmt.Sprintf("no VM slot free within %v", s.wait)}
		case <-ctx.Done():
			s.mu.Lock()
			unqueue()
			s.mu.Unlock()
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

// tryAcquire takes the claim's slots only if they are free now: no
// waiting, no queue place.
func (s *slots) tryAcquire(c slotClaim) (release func(), err error) {
	cs := callerSlot{c.profile, c.caller}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.free(c) {
		return nil, &busyError{fmt.Sprintf("no VM slot is free now for this caller (%d of %d VMs live; this caller has %d of profile %q, max_vms_per_caller %d)",
			s.used, s.max, s.caller[cs], c.profile, c.callerMax)}
	}
	s.used++
	s.profile[c.profile]++
	s.caller[cs]++
	var once sync.Once
	return func() { once.Do(func() { s.release(cs) }) }, nil
}

func (s *slots) release(cs callerSlot) {
	s.mu.Lock()
	s.used--
	s.profile[cs.profile]--
	if s.caller[cs]--; s.caller[cs] == 0 {
		delete(s.caller, cs)
	}
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// stats reports live VMs and waiting requests.
func (s *slots) stats() (used, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used, s.waiting
}
