package netstack

import (
	"sync"
	"time"
)

// Bucket bounds events to a rate per minute with bursts: a token bucket
// whose level survives a change of its rate. Its state is the debt, the
// events taken and not yet paid back by time; Retune changes the rate and
// the burst but keeps the debt, so that a policy sent again (each command
// of a session re-sends its policy) or switched back and forth grants no
// new events: only time does.
type Bucket struct {
	mu        sync.Mutex
	perMinute int
	perSec    float64
	burst     float64
	debt      float64 // events taken and not yet paid back; may exceed burst after a Retune
	last      time.Time
}

// NewBucket returns a full bucket: burst events at once, then perMinute a
// minute.
func NewBucket(perMinute int, burst float64, now time.Time) *Bucket {
	b := &Bucket{last: now}
	b.set(perMinute, burst)
	return b
}

func (b *Bucket) set(perMinute int, burst float64) {
	b.perMinute, b.perSec, b.burst = perMinute, float64(perMinute)/60, burst
}

// payBack lowers the debt by what the time since the last call earned.
// Precondition: b.mu is held.
func (b *Bucket) payBack(now time.Time) {
	if now.After(b.last) {
		b.debt = max(0, b.debt-now.Sub(b.last).Seconds()*b.perSec)
		b.last = now
	}
}

// Take reports whether one more event is allowed at now, and counts it
// when it is.
func (b *Bucket) Take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.payBack(now)
	if b.debt+1 > b.burst {
		return false
	}
	b.debt++
	return true
}

// Retune gives the bucket a new rate and burst from now on. The debt is
// kept: time until now pays it back at the old rate, and events taken
// under the old rate still count under the new one.
func (b *Bucket) Retune(perMinute int, burst float64, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.payBack(now)
	b.set(perMinute, burst)
}

// PerMinute is the bucket's current rate.
func (b *Bucket) PerMinute() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.perMinute
}
