package netstack

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/netrule"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
)

// TestSetPolicyCutsOpenConnections: a new policy holds for connections
// already open, not only new ones: one it does not allow is cut (and
// recorded so), one it allows goes on. A session locked with a download
// running, or a connection a package opened while installing, does not
// outlive the lock.
func TestSetPolicyCutsOpenConnections(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for { // a download that does not end
			if _, err := fmt.Fprintf(w, "%s\n", r.Host); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
	}))
	t.Cleanup(srv.Close) // after the network's end, which ends the downloads
	real := netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://"))
	public := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.10"), real.Port())
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, real.String())
	}
	resolve := func(context.Context, string) ([]netip.Addr, error) { return []netip.Addr{public.Addr()}, nil }
	both := mustRules(t, fmt.Sprintf("a.test:%d", real.Port()), fmt.Sprintf("b.test:%d", real.Port()))
	audit := &auditLog{}
	pol := Policy{Egress: netrule.Egress{Rules: both}, Audit: audit.add}
	n, err := New(Config{Policy: pol, Resolve: resolve, Dial: dial})
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	go func() { _ = n.Serve(a) }()
	t.Cleanup(func() { b.Close(); n.Close() })
	g := newGuest(t, b)

	open := func(host string) net.Conn {
		g.resolve(t, host)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		c, err := gonet.DialContextTCP(ctx, g.st, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(public.Addr().AsSlice()), Port: public.Port()}, ipv4.ProtocolNumber)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 512)
		_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
		if k, err := c.Read(buf); err != nil || !strings.Contains(string(buf[:k]), "200 OK") {
			t.Fatalf("%s: %q %v", host, buf[:k], err)
		}
		return c
	}
	ca, cb := open("a.test"), open("b.test")
	n.SetPolicy(pol) // the same rules again: nothing is cut
	n.SetPolicy(Policy{Egress: netrule.Egress{Rules: mustRules(t, fmt.Sprintf("b.test:%d", real.Port()))}, Audit: audit.add})
	_ = ca.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, ca); err != nil {
		t.Fatalf("the connection the new policy does not allow: %v, want it closed", err)
	}
	_ = cb.SetReadDeadline(time.Now().Add(time.Second))
	if b, err := io.ReadAll(cb); len(b) == 0 || !isTimeout(err) {
		t.Fatalf("the connection the new policy allows: %d bytes, %v; want it open", len(b), err)
	}
	recs := audit.wait(1, func(r Record) bool { return r.Proto == "tcp" })
	if len(recs) != 1 || recs[0].Name != "a.test" || !recs[0].Allowed || recs[0].Reason != "cut: "+policyCut {
		t.Fatalf("records: %+v", recs)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
