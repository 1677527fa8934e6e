package netstack

import (
	"context"
	"errors"
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
	from := netstacktest.Echo(ln)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := n.DialGuest(ctx, 8000)
	if err != nil {
		t.Fatalf("dial a listening port: %v", err)
	}
	defer c.Close()
	netstacktest.Ping(t, c)
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
