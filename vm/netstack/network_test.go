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
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/netwire/netwiretest"
	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm/netstack/netstacktest"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// guest is a second, real TCP/IP stack playing the VM: it is wired to the
// Network through QEMU's stream framing over a socket pair.
type guest struct{ st *stack.Stack }

func newGuest(t *testing.T, conn net.Conn) *guest {
	t.Helper()
	return &guest{st: netstacktest.Stack(t, conn)}
}

func (g *guest) resolve(t *testing.T, name string) (int, []netip.Addr) {
	t.Helper()
	c, err := gonet.DialUDP(g.st, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(DNSAddr.AsSlice()), Port: 53}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(name+".", dns.TypeA)
	b, _ := m.Pack()
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 4096)
	k, err := c.Read(buf)
	if err != nil {
		t.Fatalf("dns %s: %v", name, err)
	}
	var r dns.Msg
	if err := r.Unpack(buf[:k]); err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		}
	}
	return r.Rcode, out
}

// fetch sends an HTTP request with host to addr and returns the response
// (or the error the connection ended with).
func (g *guest) fetch(addr netip.AddrPort, host string) (string, error) {
	return g.send(addr, fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host))
}

// send writes raw to addr and returns what comes back until the end.
func (g *guest) send(addr netip.AddrPort, raw string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := gonet.DialContextTCP(ctx, g.st, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(addr.Addr().AsSlice()), Port: addr.Port()}, ipv4.ProtocolNumber)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

type auditLog struct {
	mu   sync.Mutex
	recs []Record
}

func (a *auditLog) add(r Record) { a.mu.Lock(); a.recs = append(a.recs, r); a.mu.Unlock() }

func (a *auditLog) find(f func(Record) bool) (Record, bool) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		a.mu.Lock()
		for _, r := range a.recs {
			if f(r) {
				a.mu.Unlock()
				return r, true
			}
		}
		a.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	return Record{}, false
}

// wait returns the first n records that match f, or fewer when they do
// not come within 10 s.
func (a *auditLog) wait(n int, f func(Record) bool) []Record {
	var out []Record
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out = out[:0]
		a.mu.Lock()
		for _, r := range a.recs {
			if f(r) && len(out) < n {
				out = append(out, r)
			}
		}
		a.mu.Unlock()
		if len(out) == n {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return out
}

func startNetwork(t *testing.T, cfg Config) (*guest, *auditLog) {
	t.Helper()
	log := &auditLog{}
	cfg.Audit = log.add
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	go func() { _ = n.Serve(a) }()
	t.Cleanup(func() { b.Close(); n.Close() })
	return newGuest(t, b), log
}

func TestNetwork(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello %s", r.Host)
	}))
	defer srv.Close()
	// The test "internet": names resolve to a documentation address
	// (TEST-NET-2, an ordinary public unicast address to the rules), and
	// the daemon-side dial of that address reaches the local test server.
	real := netip.MustParseAddrPort(strings.TrimPrefix(srv.URL, "http://"))
	port := real.Port()
	public := netip.MustParseAddr("198.51.100.10")
	sp := netip.AddrPortFrom(public, port)
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr != sp.String() {
			return nil, fmt.Errorf("test dial: unexpected %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, real.String())
	}
	table := map[string]string{"allowed.test": "198.51.100.10", "other.test": "198.51.100.10", "denied.test": "198.51.100.10", "private.test": "10.1.2.3"}
	resolve := func(_ context.Context, name string) ([]netip.Addr, error) {
		if a, ok := table[name]; ok {
			return []netip.Addr{netip.MustParseAddr(a)}, nil
		}
		return nil, fmt.Errorf("no such name %s", name)
	}
	rules, err := netrule.ParseRules([]string{fmt.Sprintf("allowed.test:%d", port), "other.test:1", fmt.Sprintf("private.test:%d", port)})
	if err != nil {
		t.Fatal(err)
	}
	// A connect rate well above the default burst: every case below is a
	// connection of its own.
	g, audit := startNetwork(t, Config{Policy: Policy{Egress: netrule.Egress{Rules: rules, ConnectRate: 6000}}, Resolve: resolve, Dial: dial})

	t.Run("A and AAAA at once on one socket", func(t *testing.T) {
		// glibc's getaddrinfo (AF_UNSPEC: curl, Python, Node) sends both
		// from one socket and waits for both answers; one lost costs the
		// resolver's timeout (2 s in vmgate's images) on every lookup.
		c, err := gonet.DialUDP(g.st, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(DNSAddr.AsSlice()), Port: 53}, ipv4.ProtocolNumber)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
			m := new(dns.Msg)
			m.SetQuestion("allowed.test.", qt)
			m.Id = uint16(100 + i)
			b, _ := m.Pack()
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		got := map[uint16]bool{}
		buf := make([]byte, 4096)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for len(got) < 2 {
			k, err := c.Read(buf)
			if err != nil {
				t.Fatalf("answers %v, then: %v", got, err)
			}
			var r dns.Msg
			if err := r.Unpack(buf[:k]); err != nil {
				t.Fatal(err)
			}
			got[r.Id] = true
		}
	})
	t.Run("allowed name and port", func(t *testing.T) {
		rc, addrs := g.resolve(t, "allowed.test")
		if rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != sp.Addr() {
			t.Fatalf("dns: rcode %d %v", rc, addrs)
		}
		body, err := g.fetch(sp, "allowed.test")
		if err != nil || !strings.Contains(body, "200 OK") || !strings.Contains(body, "hello allowed.test") {
			t.Fatalf("fetch: %v %q", err, body)
		}
		r, ok := audit.find(func(r Record) bool { return r.Proto == "tcp" && r.Allowed })
		if !ok || r.Name != "allowed.test" || r.BytesIn == 0 || r.BytesOut == 0 || r.Rule == "" {
			t.Fatalf("audit: %+v", r)
		}
	})
	t.Run("sniff corpus: only HTTP naming the allowed name, every request", func(t *testing.T) {
		g.resolve(t, "allowed.test")
		const a, o = "Host: allowed.test\r\n", "Host: other.test\r\n"
		for name, c := range map[string]struct {
			raw       string
			want, not string
		}{
			"leading CRLF":     {"\r\nGET / HTTP/1.1\r\n" + a + "\r\n", "", "hello"},
			"lowercase method": {"get / HTTP/1.1\r\n" + a + "\r\n", "", "hello"},
			"not HTTP":         {"HELO other.test\r\n", "", "hello"},
			"absolute form":    {"GET http://other.test/ HTTP/1.1\r\n" + a + "Connection: close\r\n\r\n", "", "hello"},
			"pipelined Host":   {"GET / HTTP/1.1\r\n" + a + "\r\nGET / HTTP/1.1\r\n" + o + "Connection: close\r\n\r\n", "hello allowed.test", "hello other.test"},
			"kept alive, same": {"GET / HTTP/1.1\r\n" + a + "\r\nGET / HTTP/1.1\r\n" + a + "\r\n" + "POST / HTTP/1.1\r\n" + a + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", "hello allowed.test", ""},
			// The forwarded head of a request with a body asks the server
			// to close (a server that skipped the body would read it as
			// the next request): the GET after it is not sent.
			"a body ends the connection": {"POST / HTTP/1.1\r\n" + a + "Content-Length: 5\r\n\r\nhello" + "GET / HTTP/1.1\r\n" + a + "\r\n", "hello allowed.test", ""},
			"smuggled in a body":         {"POST / HTTP/1.1\r\n" + a + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n" + o + "\r\n", "", "hello"},
			"upgrade":                    {"GET / HTTP/1.1\r\n" + a + "Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n", "", "hello"},
			"address as the Host":        {"GET / HTTP/1.1\r\nHost: 198.51.100.10\r\nConnection: close\r\n\r\n", "", "hello"},
			// Go's net/http, the server here, reads a bare LF as a line end.
			"bare LF hides a request":    {"GET / HTTP/1.1\r\n" + a + "X: y\n\nGET / HTTP/1.1\n" + o + "Connection: close\n\nZ: w\r\n\r\n", "", "hello"},
			"bare LF in a later request": {"GET / HTTP/1.1\r\n" + a + "\r\nGET / HTTP/1.1\nHost: other.test\nConnection: close\n\n", "hello allowed.test", "hello other.test"},
			"userinfo in the target":     {"GET http://allowed.test:80@other.test/ HTTP/1.1\r\n" + a + "Connection: close\r\n\r\n", "", "hello"},
		} {
			body, _ := g.send(sp, c.raw)
			if (c.want != "" && !strings.Contains(body, c.want)) || (c.not != "" && strings.Contains(body, c.not)) {
				t.Errorf("%s: %q", name, body)
			}
			if want := map[string]int{"kept alive, same": 3, "a body ends the connection": 1}[name]; want != 0 && strings.Count(body, "hello allowed.test") != want {
				t.Errorf("%s: %d responses, want %d: %q", name, strings.Count(body, "hello allowed.test"), want, body)
			}
		}
	})
	t.Run("encrypted ClientHello refused on a port allowed by name", func(t *testing.T) {
		g.resolve(t, "allowed.test")
		for _, c := range []struct {
			typ  uint16
			name string
		}{{0xfe0d, "encrypted_client_hello"}, {0xffce, "encrypted_server_name"}} {
			hello := netwiretest.WithExtension(t, netwiretest.ClientHello(t, "allowed.test"), c.typ, netwiretest.EchOuter)
			if _, err := g.send(sp, string(hello)); err != nil {
				t.Logf("send: %v", err)
			}
			if _, ok := audit.find(func(r Record) bool {
				return r.Proto == "tcp" && !r.Allowed && strings.Contains(r.Reason, c.name)
			}); !ok {
				t.Errorf("no refusal naming %s", c.name)
			}
		}
	})
	t.Run("host header must be the resolved, allowed name", func(t *testing.T) {
		g.resolve(t, "other.test") // resolves (allowed on port 1) to the same address
		body, _ := g.fetch(sp, "other.test")
		if strings.Contains(body, "hello") {
			t.Fatalf("fronted request got through: %q", body)
		}
		if _, ok := audit.find(func(r Record) bool {
			return r.Proto == "tcp" && !r.Allowed && strings.Contains(r.Reason, "does not match")
		}); !ok {
			t.Fatal("no audit record of the mismatch")
		}
	})
	t.Run("name not on the allowlist", func(t *testing.T) {
		if rc, _ := g.resolve(t, "denied.test"); rc != dns.RcodeNameError {
			t.Fatalf("rcode %d", rc)
		}
		if _, ok := audit.find(func(r Record) bool { return r.Proto == "dns" && r.Name == "denied.test" && !r.Allowed }); !ok {
			t.Fatal("no audit record")
		}
	})
	t.Run("dhcp", func(t *testing.T) {
		var wq waiter.Queue
		ep, terr := g.st.NewEndpoint(udp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
		if terr != nil {
			t.Fatal(terr)
		}
		ep.SocketOptions().SetBroadcast(true)
		if terr := ep.Bind(tcpip.FullAddress{NIC: 1, Port: 68}); terr != nil {
			t.Fatal(terr)
		}
		c := gonet.NewUDPConn(&wq, ep)
		defer c.Close()
		if _, err := c.WriteTo(dhcpPacket(dhcpDiscover), &net.UDPAddr{IP: net.IPv4bcast, Port: 67}); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 1500)
		k, _, err := c.ReadFrom(buf)
		if err != nil {
			t.Fatal(err)
		}
		m, err := parseReply(buf[:k])
		if err != nil || m.msgType != dhcpOffer || netip.AddrFrom4([4]byte(buf[16:20])) != GuestAddr {
			t.Fatalf("offer: %+v %v", m, err)
		}
	})
	t.Run("gateway unreachable", func(t *testing.T) {
		if _, err := g.fetch(netip.AddrPortFrom(GatewayAddr, 22), "allowed.test"); err == nil {
			t.Fatal("connected to the gateway")
		}
	})
	t.Run("udp refused", func(t *testing.T) {
		c, err := gonet.DialUDP(g.st, nil, &tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4([4]byte{198, 51, 100, 1}), Port: 9999}, ipv4.ProtocolNumber)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("x"))
		c.Close()
		if _, ok := audit.find(func(r Record) bool { return r.Proto == "udp" && r.Port == 9999 && !r.Allowed }); !ok {
			t.Fatal("no audit record of the refused datagram")
		}
	})

	t.Run("allowed name on a private address refused", func(t *testing.T) {
		if rc, addrs := g.resolve(t, "private.test"); rc != dns.RcodeRefused || len(addrs) != 0 {
			t.Fatalf("dns of a name on a private address: rcode %d %v", rc, addrs)
		}
		if _, err := g.fetch(netip.AddrPortFrom(netip.MustParseAddr("10.1.2.3"), port), "private.test"); err == nil {
			t.Fatal("connected to a private address")
		}
		if _, ok := audit.find(func(r Record) bool { return r.Proto == "tcp" && strings.Contains(r.Reason, "private") }); !ok {
			t.Fatal("no audit record")
		}
	})
	// A fresh network: the guest never resolved anything.
	g3, audit3 := startNetwork(t, Config{Policy: Policy{Egress: netrule.Egress{Rules: rules}}, Resolve: resolve, Dial: dial})
	t.Run("direct IP refused without a name", func(t *testing.T) {
		if _, err := g3.fetch(sp, "allowed.test"); err == nil {
			t.Fatal("connected to an address the guest never resolved")
		}
		if _, ok := audit3.find(func(r Record) bool { return r.Proto == "tcp" && strings.Contains(r.Reason, "direct connection") }); !ok {
			t.Fatal("no audit record")
		}
	})
}

func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type step struct {
		at     time.Duration
		retune int // a new rate per minute (burst a tenth), instead of a take
		want   bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"burst then refill", []step{{0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true},
			{0, 0, false}, {500 * time.Millisecond, 0, false}, {1100 * time.Millisecond, 0, true}}},
		{"the same rate again refills nothing", []step{{0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true},
			{0, 60, false}, {0, 0, false}, {0, 60, false}, {0, 0, false}}},
		{"a higher rate keeps the debt", []step{{0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true},
			{0, 120, false}, // burst 12, debt 6: six more
			{0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, false}}},
		{"switching rates back and forth refills nothing", []step{{0, 120, false},
			{0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true},
			{0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, false},
			{0, 60, false}, {0, 0, false}, {0, 120, false}, {0, 0, false}, {0, 60, false},
			// 12 taken, a burst of 6: at 1 a second, the next after 7 s.
			{6900 * time.Millisecond, 0, false}, {7100 * time.Millisecond, 0, true}}},
		{"time before a retune is paid back at the old rate", []step{{0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true}, {0, 0, true},
			{3 * time.Second, 6, false}, // 3 paid back at 1/s; now 1 in 10 s, burst 1, debt 3
			{4 * time.Second, 0, false}, {32 * time.Second, 0, false}, {33100 * time.Millisecond, 0, true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewBucket(60, 6, t0) // 1 a second, bursts of 6
			for i, s := range tc.steps {
				if s.retune != 0 {
					b.Retune(s.retune, connectBurst(s.retune), at(s.at))
					continue
				}
				if got := b.Take(at(s.at)); got != s.want {
					t.Fatalf("step %d (take at %v): %v, want %v", i, s.at, got, s.want)
				}
			}
		})
	}
}

func TestNetworkRateLimit(t *testing.T) {
	rules, _ := netrule.ParseRules([]string{"a.test:80"})
	g, audit := startNetwork(t, Config{Policy: Policy{Egress: netrule.Egress{Rules: rules, ConnectRate: 6}}, Resolve: func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("198.51.100.10")}, nil
	}, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, fmt.Errorf("no dialing in this test")
	}})
	g.resolve(t, "a.test")
	for i := 0; i < 3; i++ { // burst of 1 (6/min): the later ones are refused
		_, _ = g.fetch(netip.MustParseAddrPort("198.51.100.10:80"), "a.test")
	}
	if _, ok := audit.find(func(r Record) bool { return strings.Contains(r.Reason, "rate limit") }); !ok {
		t.Fatal("no connection refused by the rate limit")
	}
}

// TestSetPolicyForgetsNames: a pooled VM's network gets its request's
// policy at hand-out; nothing a former policy let the guest resolve may
// count as resolved under the new one.
func TestSetPolicyForgetsNames(t *testing.T) {
	n, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	a := netip.MustParseAddr("198.51.100.10")
	n.remember(DNSVerdict{Name: "allowed.test", Addrs: []netip.Addr{a}})
	if got := n.namesFor(a); len(got) != 1 {
		t.Fatalf("names before: %v", got)
	}
	n.SetPolicy(Policy{Egress: netrule.Egress{Rules: mustRules(t, "allowed.test:80")}})
	if got := n.namesFor(a); len(got) != 0 {
		t.Errorf("names after SetPolicy: %v, want none", got)
	}
	if _, _, reason := n.decide(a, 80); reason == "" {
		t.Error("a connection to an address resolved under the old policy is allowed")
	}
}

// TestSetPolicyKeepsConnectRate: each command of a session sends its
// policy again; that must not refill the guest's connection rate limit,
// or a guest whose caller runs many short commands makes as many bursts.
func TestSetPolicyKeepsConnectRate(t *testing.T) {
	rules := mustRules(t, "a.test:80")
	audit := &auditLog{}
	// 6 a minute: a burst of 1, then one every 10 s.
	pol := Policy{Egress: netrule.Egress{Rules: rules, ConnectRate: 6}, Audit: audit.add}
	n, err := New(Config{Policy: pol, Resolve: func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("198.51.100.10")}, nil
	}, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, fmt.Errorf("no dialing in this test")
	}})
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	go func() { _ = n.Serve(a) }()
	t.Cleanup(func() { b.Close(); n.Close() })
	g := newGuest(t, b)
	dst := netip.MustParseAddrPort("198.51.100.10:80")
	g.resolve(t, "a.test")
	_, _ = g.fetch(dst, "a.test") // the burst's one connection
	n.SetPolicy(pol)              // the same policy, sent again
	g.resolve(t, "a.test")        // SetPolicy forgot the names
	_, _ = g.fetch(dst, "a.test")
	tcp := audit.wait(2, func(r Record) bool { return r.Proto == "tcp" })
	if len(tcp) != 2 {
		t.Fatalf("records of the two connections: %+v", tcp)
	}
	if strings.Contains(tcp[0].Reason, "rate limit") || !strings.Contains(tcp[1].Reason, "rate limit") {
		t.Errorf("after the policy was sent again, the second connection within 10 s: %q, want refused by the rate limit (first: %q)", tcp[1].Reason, tcp[0].Reason)
	}
}
