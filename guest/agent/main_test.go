package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

// fakeSysfs builds a /sys/class/virtio-ports and /dev look-alike.
func fakeSysfs(t *testing.T, ports map[string]string, devNodes ...string) portPaths {
	t.Helper()
	root := t.TempDir()
	p := portPaths{
		sysClass: filepath.Join(root, "sys"),
		devDir:   filepath.Join(root, "dev"),
		fallback: filepath.Join(root, "dev", "virtio-ports", agentproto.PortName),
	}
	for dir, name := range ports {
		if err := os.MkdirAll(filepath.Join(p.sysClass, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p.sysClass, dir, "name"), []byte(name+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(p.fallback), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range devNodes {
		if err := os.WriteFile(filepath.Join(p.devDir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func TestFindPort(t *testing.T) {
	ports := map[string]string{"vport0p0": "org.qemu.guest_agent.0", "vport0p1": agentproto.PortName, "vport0p2": ""}
	p := fakeSysfs(t, ports, "vport0p0", "vport0p1")
	if got, err := findPort(p); err != nil || got != filepath.Join(p.devDir, "vport0p1") {
		t.Errorf("findPort = %q, %v", got, err)
	}

	// No device node for the matching port: the udev link is used.
	p = fakeSysfs(t, ports, "vport0p0", filepath.Join("virtio-ports", agentproto.PortName))
	if got, err := findPort(p); err != nil || got != p.fallback {
		t.Errorf("findPort with only the fallback = %q, %v", got, err)
	}

	p = fakeSysfs(t, map[string]string{"vport0p0": "other"}, "vport0p0")
	if _, err := findPort(p); !errors.Is(err, errPortNotFound) {
		t.Errorf("findPort without the port = %v", err)
	}
}

func TestOpenPortWaitsForDevice(t *testing.T) {
	p := fakeSysfs(t, map[string]string{"vport1p1": agentproto.PortName})
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(p.devDir, "vport1p1"), nil, 0o600)
	}()
	f, err := openPort(context.Background(), p, testTimeout, 10*time.Millisecond)
	if err != nil {
		t.Fatalf("openPort: %v", err)
	}
	f.Close()
	if f.Name() != filepath.Join(p.devDir, "vport1p1") {
		t.Errorf("opened %s", f.Name())
	}
}

func TestOpenPortGivesUp(t *testing.T) {
	p := fakeSysfs(t, nil)
	start := time.Now()
	_, err := openPort(context.Background(), p, 100*time.Millisecond, 10*time.Millisecond)
	if !errors.Is(err, errPortNotFound) {
		t.Errorf("openPort = %v, want errPortNotFound", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 5*time.Second {
		t.Errorf("gave up after %v", d)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := openPort(ctx, p, time.Hour, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("openPort with a cancelled context = %v", err)
	}
}

func TestWaitHost(t *testing.T) {
	var calls int
	hangup := func() (bool, error) {
		calls++
		return calls <= 3, nil
	}
	if err := waitHost(context.Background(), hangup, time.Millisecond); err != nil || calls != 4 {
		t.Errorf("waitHost = %v after %d polls, want nil after 4", err, calls)
	}

	boom := errors.New("boom")
	if err := waitHost(context.Background(), func() (bool, error) { return false, boom }, time.Millisecond); !errors.Is(err, boom) {
		t.Errorf("waitHost with a failing poll = %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	calls = 0
	hung := func() (bool, error) { calls++; return true, nil }
	if err := waitHost(ctx, hung, 20*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("waitHost while hung up = %v", err)
	}
	// It slept between polls instead of spinning.
	if calls > 10 {
		t.Errorf("%d polls in 100ms with a 20ms interval", calls)
	}
}

// fakePort hands out the server ends of connections pushed by a test.
type fakePort struct {
	conns   chan net.Conn
	accepts atomic.Int32
}

func (p *fakePort) accept(ctx context.Context) (net.Conn, error) {
	select {
	case c := <-p.conns:
		p.accepts.Add(1)
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func TestServePortServesConnectionsInTurn(t *testing.T) {
	cfg := Config{Logger: testLogger(t), Version: "test-version"}
	port := &fakePort{conns: make(chan net.Conn)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- servePort(ctx, port, cfg) }()

	// A peer that hangs up during the handshake does not stop the loop.
	server, peer := testutil.SocketPair(t)
	port.conns <- server
	peer.Close()

	for i := range 3 {
		server, peer := testutil.SocketPair(t)
		port.conns <- server
		c := agentconn.Client(peer, testLogger(t))
		if _, err := c.Hello(t.Context()); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		if res := run(t, c, argv("echo", "hi"), nil); res.stdout != "hi\n" {
			t.Errorf("connection %d: %+v", i, res)
		}
		c.Close()
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("servePort = %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("servePort did not return")
	}
	if n := port.accepts.Load(); n != 4 {
		t.Errorf("%d connections accepted, want 4", n)
	}
}
