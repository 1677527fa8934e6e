package gateway

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errBusy reports that no VM slot became free: the queue was full or the
// wait timed out.
var errBusy = errors.New("busy")

// slots bounds live VMs globally and per profile, with a bounded FIFO-ish
// wait: at most queueLen requests wait, each at most wait.
type slots struct {
	mu       sync.Mutex
	max      int
	used     int
	profile  map[string]int
	queueLen int
	waiting  int
	wait     time.Duration
	changed  chan struct{} // closed and replaced whenever a slot is released
}

func newSlots(max, queueLen int, wait time.Duration) *slots {
	return &slots{max: max, queueLen: queueLen, wait: wait, profile: map[string]int{}, changed: make(chan struct{})}
}

// acquire takes one global slot and one of profile's (profileMax of them).
// It returns errBusy when the queue is full or no slot frees up in time.
func (s *slots) acquire(ctx context.Context, profile string, profileMax int) (release func(), err error) {
	deadline := time.NewTimer(s.wait)
	defer deadline.Stop()
	s.mu.Lock()
	queued := false
	for {
		if s.used < s.max && (profileMax <= 0 || s.profile[profile] < profileMax) {
			s.used++
			s.profile[profile]++
			if queued {
				s.waiting--
			}
			s.mu.Unlock()
			var once sync.Once
			return func() { once.Do(func() { s.release(profile) }) }, nil
		}
		if !queued {
			if s.waiting >= s.queueLen {
				s.mu.Unlock()
				return nil, errBusy
			}
			s.waiting++
			queued = true
		}
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-deadline.C:
			s.mu.Lock()
			s.waiting--
			s.mu.Unlock()
			return nil, errBusy
		case <-ctx.Done():
			s.mu.Lock()
			s.waiting--
			s.mu.Unlock()
			return nil, ctx.Err()
		}
		s.mu.Lock()
	}
}

func (s *slots) release(profile string) {
	s.mu.Lock()
	s.used--
	s.profile[profile]--
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
