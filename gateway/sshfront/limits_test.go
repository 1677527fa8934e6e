package sshfront

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestPickVictim(t *testing.T) {
	pend := func(groups ...string) []*tracked {
		var out []*tracked
		for _, g := range groups {
			out = append(out, &tracked{peer: peer{group: g}})
		}
		return out
	}
	tests := []struct {
		name    string
		pending []*tracked
		group   string
		want    int
	}{
		{"one group: the oldest", pend("a", "a", "a"), "a", 0},
		{"a flood displaces its own", pend("b", "a", "a", "a"), "a", 1},
		{"a newcomer displaces the flood", pend("b", "a", "a", "a"), "c", 1},
		{"the flood's newest survive a newcomer", pend("a", "b", "a"), "b", 0},
		{"equal shares: the oldest", pend("b", "a", "c"), "d", 0},
		{"the newcomer's group ties: the oldest of either", pend("a", "b", "b"), "a", 0},
	}
	for _, tt := range tests {
		if got := pickVictim(tt.pending, tt.group); got != tt.want {
			t.Errorf("%s: pickVictim = %d, want %d", tt.name, got, tt.want)
		}
	}
}

type nopCloser struct{ closed *int }

func (c nopCloser) Close() error { *c.closed++; return nil }

func TestBudget(t *testing.T) {
	b := newBudget(2, 2, 1, 2)
	var closed int
	c := nopCloser{&closed}
	u := peer{group: "uid 7", uid: 7, hasUID: true, capped: true}
	tcp := peer{group: "127.0.0.1"}
	t1, _, _ := b.open(u, c)
	t2, d, l := b.open(u, c)
	if d != nil || l != limitNone {
		t.Fatalf("second open: displaced %v, limit %v", d, l)
	}
	if _, _, l := b.open(u, c); l != limitUID {
		t.Fatalf("third open of the uid: %v, want the uid limit (checked before displacing)", l)
	}
	t3, d, l := b.open(tcp, c)
	if l != limitNone || d != t1 || t1.state != phaseGone || b.uids[7] != 1 {
		t.Fatalf("open over the pending budget: displaced %p (want the uid's oldest, %p), limit %v, uid count %d", d, t1, l, b.uids[7])
	}
	t4, d, _ := b.open(u, c)
	if d != t2 || b.uids[7] != 1 {
		t.Fatalf("the uid's own oldest should make room: displaced %p, want %p; uid count %d", d, t2, b.uids[7])
	}
	if l := b.admit(t1, "k"); l != limitPending {
		t.Fatalf("admit a displaced connection: %v", l)
	}
	b.done(t1) // a displaced connection ends: it was uncounted once already
	if b.uids[7] != 1 {
		t.Fatalf("uid count %d after a displaced connection ended, want 1", b.uids[7])
	}
	if l := b.admit(t3, "k"); l != limitNone {
		t.Fatalf("admit: %v", l)
	}
	t5, _, _ := b.open(tcp, c)
	if l := b.admit(t5, "k"); l != limitKey {
		t.Fatalf("admit over the key's limit: %v", l)
	}
	if l := b.admit(t5, "k2"); l != limitNone {
		t.Fatalf("admit another key: %v", l)
	}
	t6, _, _ := b.open(tcp, c)
	if l := b.admit(t6, "k3"); l != limitConns {
		t.Fatalf("admit over MaxConns: %v", l)
	}
	for _, x := range []*tracked{t2, t3, t4, t5, t6, t6} {
		b.done(x)
	}
	if b.authed != 0 || len(b.keys) != 0 || len(b.uids) != 0 || len(b.pending) != 0 {
		t.Fatalf("after done: authed %d keys %v uids %v pending %d", b.authed, b.keys, b.uids, len(b.pending))
	}
	if closed != 0 {
		t.Fatal("the budget closed a connection itself")
	}
}

func TestBurstLog(t *testing.T) {
	var buf bytes.Buffer
	bl := newBurstLog(slog.New(slog.NewTextHandler(&buf, nil)), time.Minute)
	now := time.Unix(1000, 0)
	bl.now = func() time.Time { return now }
	steps := []struct {
		advance time.Duration
		key     string
		logged  bool
	}{
		{0, "a", true},
		{time.Second, "a", false},
		{time.Second, "b", true},
		{time.Second, "a", false},
		{time.Minute, "a", true},
		{0, "a", false},
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		if got := bl.warn(s.key, "refused"); got != s.logged {
			t.Fatalf("step %d (%s): logged %v, want %v", i, s.key, got, s.logged)
		}
	}
	if !strings.Contains(buf.String(), "not_logged_since_last=2") {
		t.Errorf("the second line for a should count the 2 not logged:\n%s", buf.String())
	}
}

func TestConfigLimits(t *testing.T) {
	var c Config
	c.setDefaults("/state")
	if c.MaxConns != 64 || c.MaxUnauthConns != 16 || c.MaxConnsPerKey != 16 || c.MaxConnsPerUID != 32 ||
		c.HandshakeTimeout != 10*time.Second || c.checkLimits() != nil {
		t.Errorf("defaults: %+v, %v", c, c.checkLimits())
	}
	small := Config{MaxConns: 2}
	small.setDefaults("/state")
	if small.MaxConnsPerKey != 1 || small.MaxConnsPerUID != 1 {
		t.Errorf("MaxConns 2: per key %d, per uid %d; want 1 and 1", small.MaxConnsPerKey, small.MaxConnsPerUID)
	}
	for _, bad := range []Config{{MaxUnauthConns: -1}, {MaxConnsPerKey: -1}, {MaxConnsPerUID: -2}, {HandshakeTimeout: -time.Second}} {
		bad.setDefaults("/state")
		if err := bad.checkLimits(); err == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
