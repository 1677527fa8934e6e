package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vmgate/vmgate/vm/netstack/netstacktest"
)

// TestDialGuest: a connection into a port the guest listens on reaches it
// from the gateway's address and carries bytes both ways, outside the
// egress policy (which allows nothing here); a port nothing listens on is
// refused at once, not timed out.
func TestDialGuest(t *testing.T) {
	n, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	go func() { _ = n.Serve(a) }()
	t.Cleanup(func() { b.Close(); n.Close() })
	g := newGuest(t, b)

	ln := netstacktest.Listen(t, g.st, 8000)
	from := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		from <- c.RemoteAddr().String()
		_, _ = io.Copy(c, c)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := n.DialGuest(ctx, 8000)
	if err != nil {
		t.Fatalf("dial a listening port: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	if src := netip.MustParseAddrPort(<-from).Addr(); src != GatewayAddr {
		t.Errorf("the guest saw the connection from %s, want the gateway %s", src, GatewayAddr)
	}

	if _, err := n.DialGuest(ctx, 8001); !errors.Is(err, ErrGuestRefused) {
		t.Errorf("dial a closed port: %v, want %v", err, ErrGuestRefused)
	}
	if _, err := n.DialGuest(ctx, 0); err == nil {
		t.Error("dial port 0: no error")
	}
}
