package gateway

import (
	"fmt"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
)

// floodGate bounds how many records of one kind a single source adds to
// the audit log: the denied requests of one caller, the refused network
// events of one VM. Records that nothing ran for are the ones a hostile
// caller or guest can make at will; every allowed request is still
// recorded on its own, before it runs.
//
// Each key may write burst records at once and rate per second after
// that (a token bucket). Records over it are held back and counted; the
// next record the key may write is preceded by one summary record ("N
// more ... not recorded one by one"), and flush writes the summary of a
// key that went quiet or whose VM is gone. The summary carries the caller
// and VM of the first record held, and the time span of all of them.
type floodGate struct {
	what  string // what the records are, for the summary: "denied requests"
	rate  float64
	burst float64

	mu   sync.Mutex
	keys map[string]*gateKey
}

type gateKey struct {
	tokens      float64
	last        time.Time // of the last token update
	held        int       // records held back since the last summary
	first, prev time.Time // of the records held
	sample      audit.Record
}

func newFloodGate(what string, rate float64, burst int) *floodGate {
	return &floodGate{what: what, rate: rate, burst: float64(burst), keys: map[string]*gateKey{}}
}

// admit decides whether rec, from key, is written now. When it is and
// records of key were held back, summary is the record to write first.
// A nil gate lets everything through.
func (g *floodGate) admit(key string, rec audit.Record, now time.Time) (write bool, summary *audit.Record) {
	if g == nil {
		return true, nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.keys[key]
	if k == nil {
		k = &gateKey{tokens: g.burst, last: now}
		g.keys[key] = k
	}
	k.tokens = min(g.burst, k.tokens+now.Sub(k.last).Seconds()*g.rate)
	k.last = now
	if k.tokens < 1 {
		if k.held == 0 {
			k.first, k.sample = now, rec
		}
		k.held++
		k.prev = now
		return false, nil
	}
	k.tokens--
	return true, g.summaryLocked(k)
}

// summaryLocked returns the summary of k's held records, or nil, and
// starts counting again. Precondition: g.mu is held.
func (g *floodGate) summaryLocked(k *gateKey) *audit.Record {
	if k.held == 0 {
		return nil
	}
	r := k.sample
	r.Argv, r.Reason, r.Rule, r.Error, r.Net = nil, "", "", "", nil
	r.Message = fmt.Sprintf("%d more %s not recorded one by one (rate limit %g/s, burst %g) from %s to %s",
		k.held, g.what, g.rate, g.burst, k.first.UTC().Format(time.RFC3339Nano), k.prev.UTC().Format(time.RFC3339Nano))
	k.held = 0
	return &r
}

// flush forgets key and returns the summary of its held records, if any.
func (g *floodGate) flush(key string) *audit.Record {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.keys[key]
	if k == nil {
		return nil
	}
	delete(g.keys, key)
	return g.summaryLocked(k)
}

// sweep forgets the keys that have been quiet since before idle (their
// bucket is full again) and returns the summaries of their held records.
func (g *floodGate) sweep(idle time.Time) []audit.Record {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []audit.Record
	for key, k := range g.keys {
		if k.last.After(idle) {
			continue
		}
		if r := g.summaryLocked(k); r != nil {
			out = append(out, *r)
		}
		delete(g.keys, key)
	}
	return out
}
