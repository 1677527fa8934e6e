package netstack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/guest/netconf"
	"github.com/vmgate/vmgate/internal/netwire"

	"github.com/vmgate/vmgate/policy/netrule"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// The guest's network, as the guest sees it (the addresses QEMU's user
// network uses, so that guest images need nothing special).
var (
	GatewayAddr = netconf.Gateway
	DNSAddr     = netconf.Resolver
	GuestAddr   = netconf.Guest.Addr()
	GuestPrefix = netconf.Guest.Masked()
	gatewayMAC  = tcpip.LinkAddress("\x52\x55\x0a\x00\x02\x02")
)

const nicID = 1

// Config is one VM's network policy and plumbing.
type Config struct {
	// Policy is the network's first policy (SetPolicy replaces it).
	Policy
	// Hosts pins names to addresses: looked up before Resolve.
	Hosts   map[string][]netip.Addr
	Resolve Resolver // DNS lookups for allowed names (default: the host's resolver)
	// Dial makes the outbound connection (default: a net.Dialer with a
	// 10 s timeout).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	Log  *slog.Logger
}

// Record is one audited network event.
type Record struct {
	Proto    string // "tcp", "udp", "dns"
	Name     string // the name the guest resolved or claimed
	Addr     netip.Addr
	Port     uint16
	Allowed  bool
	Rule     string
	Reason   string
	BytesOut int64 // guest → world
	BytesIn  int64 // world → guest
	Duration time.Duration
	// Intercepted: the netstack terminated the guest's TLS, to put
	// secrets in (secrets.go). Secret and SecretPlace name a secret whose
	// placeholder (or value, coming back) was where it may not be.
	Intercepted         bool
	Secret, SecretPlace string
}

// Network is the user-space network of one VM: an Ethernet segment with
// a gateway and a DNS server, behind which only allowlisted connections
// are made, by vmgated itself.
type Network struct {
	cfg   Config // plumbing: Resolve, Dial, Log
	pol   atomic.Pointer[policyState]
	st    *stack.Stack
	link  *channel.Endpoint
	conns atomic.Int64
	bytes atomic.Int64
	// bucket is the connect rate limit; it outlives policies (SetPolicy).
	bucket *Bucket

	mu    sync.Mutex
	names map[netip.Addr]map[string]bool // answered by DNS
	live  map[*liveConn]struct{}         // open connections (SetPolicy cuts those it does not allow)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// Limits of a policy that leaves them zero.
const (
	DefaultMaxConns    = 32
	DefaultMaxBytes    = 256 << 20
	DefaultConnectRate = 120 // per minute
)

// Policy is what a network allows; it can change while the network runs
// (a pooled VM gets its request's policy when it is handed out).
type Policy struct {
	// Egress is what the network allows. MaxConns bounds concurrent
	// connections (default 32); MaxBytes the bytes of all connections in
	// both directions (default 256 MiB); ConnectRate new connections per
	// minute (default 120), with bursts of up to a tenth of it.
	netrule.Egress
	// Audit receives one record per connection attempt and DNS query.
	Audit func(Record)
	// Secrets are the VM's secrets (secrets.go); CA is its session's CA,
	// which signs what the guest is shown for their hosts over TLS (nil:
	// no interception); Roots verify those hosts (nil: the host's roots).
	Secrets []Secret
	CA      *SessionCA
	Roots   *x509.CertPool
}

type policyState struct {
	Policy
	dns *DNS
}

// connectBurst is the burst of a connect rate: a tenth of it, at least 1.
func connectBurst(perMinute int) float64 { return max(float64(perMinute)/10, 1) }

// SetPolicy replaces the network's policy for new DNS queries and
// connections, and cuts the open connections it does not allow (a
// narrowed or locked network holds for what is already open too); the
// others keep running. The names earlier
// answers resolved are forgotten, so that no address a former policy let
// the guest resolve counts as resolved under the new one. The connect
// rate limit takes the new rate but keeps what the guest has used of it:
// a policy sent again (each command of a session sends its own) does not
// refill it.
func (n *Network) SetPolicy(p Policy) {
	n.mu.Lock()
	clear(n.names)
	n.mu.Unlock()
	if p.MaxConns == 0 {
		p.MaxConns = DefaultMaxConns
	}
	if p.MaxBytes == 0 {
		p.MaxBytes = DefaultMaxBytes
	}
	if p.ConnectRate == 0 {
		p.ConnectRate = DefaultConnectRate
	}
	if p.Audit == nil {
		p.Audit = func(Record) {}
	}
	n.bucket.Retune(p.ConnectRate, connectBurst(p.ConnectRate), time.Now())
	n.pol.Store(&policyState{Policy: p, dns: &DNS{Rules: p.Rules, Allowed: p.AllowedRanges, Resolve: n.cfg.Resolve}})
	n.mu.Lock()
	defer n.mu.Unlock()
	for c := range n.live {
		if !c.allowedBy(p.Rules) {
			delete(n.live, c)
			c.cut()
		}
	}
}

// liveConn is an open connection of the guest, as it was let through:
// the name it claimed (TLS SNI, HTTP Host), or none under an address
// rule.
type liveConn struct {
	name string
	dst  netip.Addr
	port uint16
	cut  func() // closes both sides, saying why
}

// allowedBy reports whether rules allow the connection still: its name
// on its port, or (no name) its address.
func (c *liveConn) allowedBy(rules netrule.Rules) bool {
	if c.name != "" {
		_, ok := rules.AllowsName(c.name, c.port)
		return ok
	}
	_, ok := rules.AllowsAddr(c.dst, c.port)
	return ok
}

// track adds c to the open connections, unless the policy in force now
// does not allow it (one SetPolicy stored as it was let through).
func (n *Network) track(c *liveConn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !c.allowedBy(n.p().Rules) {
		return false
	}
	n.live[c] = struct{}{}
	return true
}

func (n *Network) untrack(c *liveConn) {
	n.mu.Lock()
	delete(n.live, c)
	n.mu.Unlock()
}

// policyCut is why SetPolicy cut a connection.
const policyCut = "the network's new policy does not allow it"

func (n *Network) p() *policyState { return n.pol.Load() }

// New builds the network; Serve connects it to QEMU.
func New(cfg Config) (*Network, error) {
	if cfg.Dial == nil {
		d := &net.Dialer{Timeout: 10 * time.Second}
		cfg.Dial = d.DialContext
	}
	if cfg.Resolve == nil {
		cfg.Resolve = LookupHost
	}
	if hosts, next := cfg.Hosts, cfg.Resolve; len(hosts) > 0 {
		cfg.Resolve = func(ctx context.Context, name string) ([]netip.Addr, error) {
			if a, ok := hosts[name]; ok {
				return a, nil
			}
			return next(ctx, name)
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	// SetPolicy sets the bucket's rate; until then it allows nothing.
	n := &Network{cfg: cfg, names: map[netip.Addr]map[string]bool{}, live: map[*liveConn]struct{}{}, bucket: NewBucket(0, 0, time.Now())}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.SetPolicy(cfg.Policy)
	n.st = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	n.link = channel.New(512, 1500+header.EthernetMinimumSize, gatewayMAC)
	if err := n.st.CreateNIC(nicID, ethernet.New(n.link)); err != nil {
		return nil, fmt.Errorf("netstack: nic: %s", err)
	}
	for _, a := range []netip.Addr{GatewayAddr, DNSAddr} {
		pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: tcpip.AddrFromSlice(a.AsSlice()).WithPrefix()}
		pa.AddressWithPrefix.PrefixLen = GuestPrefix.Bits()
		if err := n.st.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return nil, fmt.Errorf("netstack: address: %s", err)
		}
	}
	// Accept packets for any destination: every outbound connection of
	// the guest ends here and is decided by the forwarders.
	if err := n.st.SetPromiscuousMode(nicID, true); err != nil {
		return nil, fmt.Errorf("netstack: %s", err)
	}
	if err := n.st.SetSpoofing(nicID, true); err != nil {
		return nil, fmt.Errorf("netstack: %s", err)
	}
	n.st.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}})
	n.st.SetTransportProtocolHandler(tcp.ProtocolNumber, tcp.NewForwarder(n.st, 0, 64, n.tcp).HandlePacket)
	n.st.SetTransportProtocolHandler(udp.ProtocolNumber, udp.NewForwarder(n.st, n.udp).HandlePacket)
	if err := n.startDHCP(); err != nil {
		n.st.Close()
		return nil, err
	}
	return n, nil
}

// startDHCP serves DHCP on port 67: the guest is always offered GuestAddr.
func (n *Network) startDHCP() error {
	var wq waiter.Queue
	ep, terr := n.st.NewEndpoint(udp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		return fmt.Errorf("netstack: dhcp: %s", terr)
	}
	ep.SocketOptions().SetBroadcast(true)
	if terr := ep.Bind(tcpip.FullAddress{NIC: nicID, Port: 67}); terr != nil {
		ep.Close()
		return fmt.Errorf("netstack: dhcp: %s", terr)
	}
	conn := gonet.NewUDPConn(&wq, ep)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		go func() { <-n.ctx.Done(); conn.Close() }()
		buf := make([]byte, 1500)
		bcast := &net.UDPAddr{IP: net.IPv4bcast, Port: 68}
		for {
			k, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			m, err := parseDHCP(buf[:k])
			if err != nil {
				n.cfg.Log.Debug("netstack: dhcp", "err", err)
				continue
			}
			if r := dhcpReply(m); r != nil {
				_, _ = conn.WriteTo(r, bcast)
			}
		}
	}()
	return nil
}

// Serve moves frames between the stack and QEMU's stream netdev on conn
// until either side ends.
func (n *Network) Serve(conn net.Conn) error {
	errc := make(chan error, 2)
	go func() {
		buf := make([]byte, netwire.MaxFrame)
		for {
			frame, err := netwire.ReadFrame(conn, buf)
			if err != nil {
				errc <- err
				return
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(append([]byte(nil), frame...))})
			n.link.InjectInbound(0, pkt)
			pkt.DecRef()
		}
	}()
	go func() {
		var out []byte
		for {
			pkt := n.link.ReadContext(n.ctx)
			if pkt == nil {
				errc <- n.ctx.Err()
				return
			}
			v := pkt.ToView()
			out = netwire.AppendFrame(out[:0], v.AsSlice())
			v.Release()
			pkt.DecRef()
			if _, err := conn.Write(out); err != nil {
				errc <- err
				return
			}
		}
	}()
	err := <-errc
	conn.Close()
	if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Close stops the network and every connection it carries.
func (n *Network) Close() {
	n.cancel()
	n.st.Close()
	n.wg.Wait()
	n.st.Wait()
}

func toAddr(a tcpip.Address) netip.Addr {
	ip, _ := netip.AddrFromSlice(a.AsSlice())
	return ip.Unmap()
}

// udp serves DNS on the DNS address and refuses everything else.
func (n *Network) udp(r *udp.ForwarderRequest) {
	id := r.ID()
	dst, port := toAddr(id.LocalAddress), id.LocalPort
	if dst != DNSAddr || port != 53 {
		n.p().Audit(Record{Proto: "udp", Addr: dst, Port: port, Reason: "UDP is not allowed (only DNS to " + DNSAddr.String() + ")"})
		return
	}
	var wq waiter.Queue
	ep, err := r.CreateEndpoint(&wq)
	if err != nil {
		return
	}
	conn := gonet.NewUDPConn(&wq, ep)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer conn.Close()
		// Every query of the flow is answered, not only its first: glibc
		// sends A and AAAA from one socket at once, and a second query
		// dropped with the endpoint cost every lookup the resolver's
		// timeout. The flow ends when it idles, or after dnsFlowMax
		// queries (a new source port starts another).
		buf := make([]byte, maxQuery+1)
		for range dnsFlowMax {
			_ = conn.SetReadDeadline(time.Now().Add(dnsFlowIdle))
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.answerDNS(conn, buf[:k])
		}
	}()
}

// A DNS flow (one guest socket) is served until it is idle for
// dnsFlowIdle (a resolver's retry on the same socket comes within it:
// 2 s in vmgate's images), for at most dnsFlowMax queries.
const (
	dnsFlowIdle = 3 * time.Second
	dnsFlowMax  = 64
)

// answerDNS answers one query of the guest's on conn, and audits it.
func (n *Network) answerDNS(conn net.Conn, query []byte) {
	resp, v := n.p().dns.Handle(n.ctx, query)
	if v.Probe {
		_, _ = conn.Write(resp)
		return
	}
	n.remember(v)
	rec := Record{Proto: "dns", Name: v.Name, Allowed: v.Allowed && len(v.Addrs) > 0, Rule: v.Rule, Reason: v.Reason}
	if len(v.Addrs) > 0 {
		rec.Addr = v.Addrs[0]
	}
	n.p().Audit(rec)
	if resp != nil {
		_, _ = conn.Write(resp)
	}
}

func (n *Network) remember(v DNSVerdict) {
	if len(v.Addrs) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range v.Addrs {
		if n.names[a] == nil {
			n.names[a] = map[string]bool{}
		}
		n.names[a][v.Name] = true
	}
}

// namesFor returns the names the guest resolved to a.
func (n *Network) namesFor(a netip.Addr) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for name := range n.names[a] {
		out = append(out, name)
	}
	return out
}

// decide checks a TCP destination before the connection is accepted: by
// a name the guest resolved to it, or by an address rule.
func (n *Network) decide(dst netip.Addr, port uint16) (name string, rule netrule.Rule, reason string) {
	if GuestPrefix.Contains(dst) {
		return "", netrule.Rule{}, "the gateway and the guest network are not reachable"
	}
	if c := Classify(dst); c != "" && !n.p().dns.allowedRange(dst) {
		return "", netrule.Rule{}, "address refused: " + c
	}
	for _, nm := range n.namesFor(dst) {
		if r, ok := n.p().Rules.AllowsName(nm, port); ok {
			return nm, r, ""
		}
	}
	if r, ok := n.p().Rules.AllowsAddr(dst, port); ok {
		return "", r, ""
	}
	if names := n.namesFor(dst); len(names) > 0 {
		return names[0], netrule.Rule{}, fmt.Sprintf("port %d is not allowed for %s", port, names[0])
	}
	return "", netrule.Rule{}, "direct connection to an address no allowed name resolved to"
}

func (n *Network) tcp(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst, port := toAddr(id.LocalAddress), id.LocalPort
	rec := Record{Proto: "tcp", Addr: dst, Port: port}
	name, rule, reason := n.decide(dst, port)
	rec.Name = name
	if reason == "" && n.conns.Load() >= int64(n.p().MaxConns) {
		reason = fmt.Sprintf("connection limit (%d) reached", n.p().MaxConns)
	}
	if reason == "" && n.bytes.Load() >= n.p().MaxBytes {
		reason = fmt.Sprintf("byte limit (%d) reached", n.p().MaxBytes)
	}
	if reason == "" && !n.bucket.Take(time.Now()) {
		reason = fmt.Sprintf("connection rate limit (%d per minute) reached", n.p().ConnectRate)
	}
	if reason != "" {
		rec.Reason = reason
		r.Complete(true)
		n.p().Audit(rec)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		rec.Reason = "accept: " + terr.String()
		n.p().Audit(rec)
		return
	}
	r.Complete(false)
	guest := gonet.NewTCPConn(&wq, ep)
	n.conns.Add(1)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer n.conns.Add(-1)
		defer guest.Close()
		t0 := time.Now()
		rec.Rule = rule.Text
		rec.Allowed, rec.Reason = n.proxy(guest, &rec, dst, port, rule.Name != "")
		rec.Duration = time.Since(t0)
		n.p().Audit(rec)
	}()
}

// proxy checks the name the connection claims, dials out and copies both
// ways; it returns whether the connection was made and why not (or why it
// was cut). On a port allowed by a name rule (byName) the connection must
// be TLS whose SNI is that name (and no encrypted ClientHello), or HTTP
// whose every request's Host is.
func (n *Network) proxy(guest net.Conn, rec *Record, dst netip.Addr, port uint16, byName bool) (bool, string) {
	head, claimed, proto, reason := n.claim(guest, rec, dst, port, byName)
	if reason != "" {
		return false, reason
	}
	p := n.p()
	var secrets *netwire.Secrets
	if len(p.Secrets) > 0 {
		secrets = secretsFor(p.Secrets, claimed, port)
		if proto == netwire.ProtoTLS && len(secrets.Bound) > 0 && p.CA != nil {
			return n.intercept(guest, head, rec, dst, port, claimed, secrets)
		}
		// Not intercepted: the guest's bytes are watched for
		// placeholders (plain HTTP by name: replaced where bound).
		if f := placeholderIn(head, secrets.All); f != nil && !(byName && proto == netwire.ProtoHTTP) {
			rec.Secret, rec.SecretPlace = f.Secret, f.Place
			return false, "secrets: " + f.Error()
		}
	}
	ctx, cancel := context.WithTimeout(n.ctx, 15*time.Second)
	out, err := n.cfg.Dial(ctx, "tcp", netip.AddrPortFrom(dst, port).String())
	cancel()
	if err != nil {
		return false, "dial: " + err.Error()
	}
	defer out.Close()
	done := make(chan struct{}, 2)
	var cut atomic.Value // why the guard, or a new policy, cut the connection
	lc := &liveConn{name: claimed, dst: dst, port: port, cut: func() { cut.Store(policyCut); out.Close(); guest.Close() }}
	if !n.track(lc) {
		return true, "cut: " + policyCut
	}
	defer n.untrack(lc)
	var guards []func() // what the secrets' guards found, into cut
	var raw io.Writer = out
	if secrets != nil && !(byName && proto == netwire.ProtoHTTP) {
		// Not HTTP the netstack reads: a placeholder in what the guest
		// sends stops it there.
		g := netwire.NewGuard(out, secrets.All, "connection")
		guards = append(guards, func() {
			if f := g.Found(); f != nil {
				rec.Secret, rec.SecretPlace = f.Secret, f.Place
				cut.Store("secrets: " + f.Error())
			}
		})
		raw = g
	}
	sp := &splice{n: n, guest: guest, out: out, rec: rec, done: done, cut: &cut}
	if byName && proto == netwire.ProtoHTTP {
		// Every request is checked, not only the first.
		go sp.requests(head, claimed, secrets)
	} else {
		// Through the guard, when there is one: a placeholder may span
		// the first bytes and the next.
		if _, err := raw.Write(head); err != nil {
			return true, "write: " + err.Error()
		}
		rec.BytesOut += int64(len(head))
		n.bytes.Add(int64(len(head)))
		go sp.pump(out, guest, &rec.BytesOut, raw)
	}
	var back io.Writer = guest
	if secrets != nil && len(secrets.Bound) > 0 {
		// Plain HTTP to a bound host: its answers are watched for the
		// values.
		g := netwire.NewValueGuard(guest, secrets.Bound, "answer")
		guards = append(guards, func() {
			if f := g.Found(); f != nil {
				rec.Secret, rec.SecretPlace = f.Secret, f.Place
				cut.Store(fmt.Sprintf("secrets: %s sent secret %s's value back", claimed, f.Secret))
			}
		})
		back = g
	}
	go sp.pump(guest, out, &rec.BytesIn, back)
	n.awaitBoth(done, func() { out.Close(); guest.Close() })
	for _, g := range guards {
		g()
	}
	if why, _ := cut.Load().(string); why != "" {
		return true, "cut: " + why
	}
	return true, ""
}

// splice is one proxied connection's two directions: each sends one value
// on done when it ends, and stores in cut why it cut the connection.
type splice struct {
	n          *Network
	guest, out net.Conn
	rec        *Record
	done       chan<- struct{}
	cut        *atomic.Value
}

// requests copies the guest's HTTP requests out, checking every one, not
// only the first. On a refused request nothing more goes out; the answers
// to the requests before it still come back.
func (sp *splice) requests(head []byte, claimed string, secrets *netwire.Secrets) {
	in := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(head), sp.guest), 32<<10)
	w := &countWriter{w: sp.out, n: sp.n, total: &sp.rec.BytesOut}
	var why string
	if secrets != nil {
		var found *netwire.Found
		why, found = netwire.CopyRequestsSecrets(w, in, claimed, secrets)
		if found != nil {
			sp.rec.Secret, sp.rec.SecretPlace = found.Secret, found.Place
		}
	} else {
		why = netwire.CopyRequests(w, in, claimed)
	}
	if why != "" {
		sp.cut.Store(why)
	}
	closeWrite(sp.out)
	sp.done <- struct{}{}
}

// pump copies src to w, counting into total and the network's byte
// budget, then closes dst's writing half.
func (sp *splice) pump(dst, src net.Conn, total *int64, w io.Writer) {
	b := make([]byte, 32<<10)
	for {
		k, err := src.Read(b)
		if k > 0 {
			atomic.AddInt64(total, int64(k))
			if sp.n.bytes.Add(int64(k)) > sp.n.p().MaxBytes {
				break
			}
			if _, werr := w.Write(b[:k]); werr != nil {
				var f *netwire.Found
				if errors.As(werr, &f) {
					// A secrets' guard: the connection ends here.
					sp.out.Close()
					sp.guest.Close()
				}
				break
			}
		}
		if err != nil {
			break
		}
	}
	closeWrite(dst)
	sp.done <- struct{}{}
}

// closeWrite closes c's writing half, where it has one.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

// awaitBoth waits for a connection's two directions (one value each on
// done). When the network closes, or one direction outlives the other by
// 30 s, closeBoth ends them; it returns once both have ended, so that
// nothing counts into the connection's record after it is read.
func (n *Network) awaitBoth(done <-chan struct{}, closeBoth func()) {
	got := 0
	select {
	case <-done:
		got++
		select {
		case <-done:
			got++
		case <-time.After(30 * time.Second):
		}
	case <-n.ctx.Done():
	}
	if got < 2 {
		closeBoth()
		for ; got < 2; got++ {
			<-done
		}
	}
}

// claim reads the start of a guest connection and checks the name it
// claims (TLS SNI, HTTP Host) against the address and port; it returns
// what it read, the name and protocol, or why the connection is refused.
func (n *Network) claim(guest net.Conn, rec *Record, dst netip.Addr, port uint16, byName bool) (head []byte, claimed, proto, reason string) {
	head = make([]byte, 0, 4096)
	buf := make([]byte, 4096)
	_ = guest.SetReadDeadline(time.Now().Add(10 * time.Second))
	var st netwire.Claim
	for {
		k, err := guest.Read(buf)
		head = append(head, buf[:k]...)
		var serr error
		st, serr = netwire.SniffName(head)
		claimed, proto = st.Name, st.Proto
		if serr == nil {
			break
		}
		if !errors.Is(serr, netwire.ErrNeedMore) {
			return nil, "", proto, "malformed " + proto + " start: " + serr.Error()
		}
		if err != nil || len(head) >= netwire.MaxSniff {
			if len(head) == 0 && err != nil {
				return nil, "", proto, "the guest sent nothing"
			}
			return nil, "", proto, "could not read the name the connection claims"
		}
	}
	_ = guest.SetReadDeadline(time.Time{})
	if _, err := netip.ParseAddr(claimed); err == nil {
		claimed = "" // "Host: 203.0.113.7": an address, not a name
	}
	if byName && st.Hidden != "" {
		// The outer SNI names an allowed front; the server decrypts the
		// inner ClientHello and reaches whatever site it names.
		return nil, "", proto, fmt.Sprintf("port %d of %s is allowed by name: TLS with %s is refused, it hides the name the connection reaches (outer name %q)", port, dst, st.Hidden, claimed)
	}
	if byName && claimed == "" {
		return nil, "", proto, fmt.Sprintf("port %d of %s is allowed by name: the connection must be HTTP or TLS that names it (got %s)", port, dst, describeStart(proto, head))
	}
	if claimed != "" {
		// TLS SNI or HTTP Host must be a name the guest resolved to this
		// address and that is allowed on this port: no domain fronting.
		resolved := false
		for _, nm := range n.namesFor(dst) {
			resolved = resolved || nm == claimed
		}
		if _, ok := n.p().Rules.AllowsName(claimed, port); !ok || (!resolved && rec.Name != "") {
			return nil, "", proto, fmt.Sprintf("%s name %q does not match the allowed name for %s", proto, claimed, dst)
		}
		rec.Name = claimed
	}
	return head, claimed, proto, ""
}

// countWriter counts what the guest sends against the VM's byte limit.
type countWriter struct {
	w     io.Writer
	n     *Network
	total *int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	atomic.AddInt64(c.total, int64(len(p)))
	if c.n.bytes.Add(int64(len(p))) > c.n.p().MaxBytes {
		return 0, errors.New("byte limit reached")
	}
	return c.w.Write(p)
}

// describeStart says what a connection's first bytes were, for a refusal.
func describeStart(proto string, head []byte) string {
	switch proto {
	case netwire.ProtoTLS:
		return "TLS without a server name"
	case netwire.ProtoHTTP:
		return "HTTP whose Host is an address"
	}
	return fmt.Sprintf("%d bytes of neither (%.16q)", len(head), head)
}
