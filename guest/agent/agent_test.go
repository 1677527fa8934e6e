package agent

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
)

func TestServeRejectsAnotherProtocol(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	// An SSH client (a host before the framed protocol) gets nothing
	// and the connection ends.
	if _, err := a.conn.Write([]byte("SSH-2.0-Go\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.waitServe(t); err == nil {
		t.Fatal("Serve returned nil for a peer that did not speak the protocol")
	}
}

func TestServeRefusesAnotherProtocolVersion(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	f := a.raw(t, &agentproto.Hello{Protocol: 99}).read()
	var r agentproto.HelloReply
	if err := r.UnmarshalBinary(f.Payload); err != nil || f.Type != agentproto.FrameHello || !strings.Contains(r.Error, "protocol 1, not 99") {
		t.Fatalf("answer %v %+v %v", f.Type, r, err)
	}
	if err := a.waitServe(t); err == nil {
		t.Fatal("Serve returned nil after refusing the host")
	}
}

func TestServeReturnsNilWhenClientCloses(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	c := a.dial(t)
	c.Close()
	if err := a.waitServe(t); err != nil {
		t.Errorf("Serve = %v, want nil", err)
	}
}

func TestServeStopsWhenContextEnds(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	c := a.dial(t)
	r := start(t, c, agentproto.ExecSpec{Argv: []string{"sh", "-c", "echo $$; exec sleep 100"}})
	pid := waitPID(t, r)
	a.cancel()
	if err := a.waitServe(t); !errors.Is(err, context.Canceled) {
		t.Errorf("Serve = %v, want context.Canceled", err)
	}
	if !processGone(pid) {
		t.Errorf("command %d survived the end of Serve", pid)
	}
}

func TestServeRejectsUnknownCalls(t *testing.T) {
	t.Parallel()
	c := client(t)
	for _, name := range []string{"tcpip-forward", "exec", "no-such-request"} {
		err := c.Call(t.Context(), name, nil, nil)
		var ce *agentconn.CallError
		if !errors.As(err, &ce) || !strings.Contains(ce.Msg, "unknown call") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}

// setTime sends a CallSetTime with the argument st.
func setTime(t *testing.T, c *agentconn.Conn, st agentproto.SetTime) error {
	t.Helper()
	return c.Call(t.Context(), agentproto.CallSetTime, st, nil)
}

func TestSetTime(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		got []time.Time
	)
	a := startAgent(t, func(c *Config) {
		c.setClock = func(tm time.Time) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, tm)
			return nil
		}
	})
	c := a.dial(t)
	want := time.Date(2031, 5, 6, 7, 8, 9, 123456789, time.UTC)
	if err := setTime(t, c, agentproto.SetTime{UnixNano: want.UnixNano()}); err != nil {
		t.Fatalf("set time: %v", err)
	}
	for _, bad := range []wire{
		nil,
		wire("short"),
		encode(agentproto.SetTime{UnixNano: 0}),
		encode(agentproto.SetTime{UnixNano: -5}),
	} {
		var ce *agentconn.CallError
		if err := c.Call(t.Context(), agentproto.CallSetTime, bad, nil); !errors.As(err, &ce) {
			t.Errorf("set time with %q: %v, want refusal", bad, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || !got[0].Equal(want) {
		t.Errorf("clock set to %v, want exactly [%v]", got, want)
	}
}

func TestSetTimeReseeds(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		seeds [][]byte
	)
	a := startAgent(t, func(c *Config) {
		c.setClock = func(time.Time) error { return nil }
		c.reseed = func(b []byte) error {
			mu.Lock()
			defer mu.Unlock()
			seeds = append(seeds, b)
			return nil
		}
	})
	c := a.dial(t)
	seed := []byte("0123456789abcdef0123456789abcdef")
	if err := setTime(t, c, agentproto.SetTime{UnixNano: 1700000000000000000, Entropy: seed}); err != nil {
		t.Fatalf("set time with entropy: %v", err)
	}
	// No entropy: no reseed. Too much: refused, nothing done.
	if err := setTime(t, c, agentproto.SetTime{UnixNano: 1700000000000000000}); err != nil {
		t.Fatalf("set time: %v", err)
	}
	if err := setTime(t, c, agentproto.SetTime{UnixNano: 1700000000000000000, Entropy: make([]byte, agentproto.MaxEntropy+1)}); err == nil {
		t.Fatal("set time with too much entropy accepted")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seeds) != 1 || string(seeds[0]) != string(seed) {
		t.Fatalf("reseeded with %q, want exactly [%q]", seeds, seed)
	}
}

func TestSetTimeLeavesARightClock(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	a := startAgent(t, func(c *Config) {
		c.setClock = func(time.Time) error { calls.Add(1); return nil }
	})
	c := a.dial(t)
	for _, off := range []time.Duration{0, 50 * time.Millisecond, -50 * time.Millisecond, time.Second} {
		if err := setTime(t, c, agentproto.SetTime{UnixNano: time.Now().Add(off).UnixNano()}); err != nil {
			t.Fatalf("offset %v: %v", off, err)
		}
	}
	if n := calls.Load(); n != 1 { // only the one-second offset
		t.Fatalf("clock set %d times, want 1", n)
	}
}

func TestSetTimeFailureIsAnErrorReply(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		c.setClock = func(time.Time) error { return os.ErrPermission }
	})
	c := a.dial(t)
	var ce *agentconn.CallError
	if err := setTime(t, c, agentproto.SetTime{UnixNano: 1700000000000000000}); !errors.As(err, &ce) || !strings.Contains(ce.Msg, "permission denied") {
		t.Fatalf("set time with a failing clock: %v, want a refusal saying why", err)
	}
}

func TestSetSystemClockUnprivileged(t *testing.T) {
	// Only safe where the call must fail: the tests never change the clock.
	if os.Geteuid() == 0 {
		t.Skip("running as root: setting the clock could succeed")
	}
	if err := setSystemClock(time.Now()); err == nil {
		t.Fatal("setSystemClock succeeded without privileges")
	}
}

func TestInfo(t *testing.T) {
	t.Parallel()
	c := client(t)
	var info agentproto.Info
	if err := c.Call(t.Context(), agentproto.CallInfo, nil, &info); err != nil {
		t.Fatalf("info: %v", err)
	}
	if info.AgentVersion != "test-version" {
		t.Errorf("AgentVersion = %q, want test-version", info.AgentVersion)
	}
	if info.Kernel == "" {
		t.Error("Kernel is empty")
	}
	for _, f := range []string{agentproto.FeatureTransfer, agentproto.FeatureUsers, agentproto.FeatureProcs, agentproto.FeatureFS} {
		if !slices.Contains(info.Features, f) {
			t.Errorf("Features = %q, want %s among them", info.Features, f)
		}
	}
	if h, _ := os.Hostname(); info.Hostname != h {
		t.Errorf("Hostname = %q, want %q", info.Hostname, h)
	}
	if b, err := os.ReadFile(bootIDPath); err == nil && info.BootID != strings.TrimSpace(string(b)) {
		t.Errorf("BootID = %q, want %q", info.BootID, strings.TrimSpace(string(b)))
	}
}
