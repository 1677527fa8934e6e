package netproc

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/netstack"
)

// TestSetPolicyWaits: SetPolicy returns once the netstack says the policy
// is in force, and kills a netstack that does not say so in time; a
// netstack that says so of a policy it was never sent misbehaves.
func TestSetPolicyWaits(t *testing.T) {
	newProc := func(t *testing.T) (*Proc, *net.UnixConn) {
		daemon, child := testutil.SeqpacketPair(t)
		p := &Proc{ctl: daemon, log: slog.New(slog.DiscardHandler), audits: map[uint64]func(netstack.Record){},
			done: make(chan struct{}), recordsDone: make(chan struct{}), appliedCh: make(chan struct{}), applyWait: 2 * time.Second}
		go p.readRecords()
		return p, child
	}
	t.Run("in force", func(t *testing.T) {
		p, child := newProc(t)
		go func() { // a netstack: it applies each policy and says so
			buf := make([]byte, MaxMessage)
			for {
				k, err := child.Read(buf)
				if err != nil {
					return
				}
				var m toChild
				if decodeStrict(buf[:k], &m) != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
				b, _ := json.Marshal(fromChild{Gen: m.Gen, Applied: true})
				_, _ = child.Write(b)
			}
		}()
		t0 := time.Now()
		for range 3 {
			p.SetPolicy(netstack.Policy{})
		}
		if d := time.Since(t0); d < 300*time.Millisecond {
			t.Errorf("SetPolicy returned before the policies were in force (%v)", d)
		}
		p.mu.Lock()
		applied, gen := p.applied, p.gen
		p.mu.Unlock()
		if applied != 3 || gen != 3 {
			t.Errorf("applied %d of %d policies", applied, gen)
		}
	})
	t.Run("never", func(t *testing.T) {
		p, _ := newProc(t)
		p.SetPolicy(netstack.Policy{})
		select {
		case <-p.recordsDone: // killed: its channel is closed
		case <-time.After(5 * time.Second):
			t.Fatal("a netstack that never applied its policy was kept")
		}
	})
	t.Run("a policy never sent", func(t *testing.T) {
		p, child := newProc(t)
		b, _ := json.Marshal(fromChild{Gen: 9, Applied: true})
		if _, err := child.Write(b); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.recordsDone:
		case <-time.After(5 * time.Second):
			t.Fatal("a netstack that applied a policy it was never sent was kept")
		}
	})
}

// TestWriteToStalledNetstack: a netstack that stops reading its channel
// cannot block the daemon: once the channel is full, a write (a policy, a
// dial into a published port) fails at the wait's end, and the netstack
// is killed. Before, the write blocked for ever, and with it the command
// or the session's end that made it.
func TestWriteToStalledNetstack(t *testing.T) {
	daemon, _ := testutil.SeqpacketPair(t) // the other end never reads
	p := &Proc{ctl: daemon, log: slog.New(slog.DiscardHandler), audits: map[uint64]func(netstack.Record){},
		done: make(chan struct{}), recordsDone: make(chan struct{}), appliedCh: make(chan struct{}), applyWait: 200 * time.Millisecond}
	msg := make([]byte, 32<<10)
	t0 := time.Now()
	var err error
	for i := 0; i < 1000 && err == nil; i++ {
		err = p.write(msg, nil)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("writes to a netstack that does not read: %v, want a deadline", err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("the write failed after %v", d)
	}
	if err := p.write([]byte("{}"), nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a write after the kill: %v, want the channel closed", err)
	}
}
