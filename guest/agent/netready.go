package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// netPaths says where the readiness check reads the guest's network state.
type netPaths struct {
	route      string // /proc/net/route
	resolvConf string // /etc/resolv.conf
}

var defaultNetPaths = netPaths{route: "/proc/net/route", resolvConf: "/etc/resolv.conf"}

// Timing of the readiness check.
const (
	netPollInterval = 25 * time.Millisecond
	dnsProbeTimeout = 500 * time.Millisecond
)

// netChecker checks the guest network; its parts are replaced by tests.
type netChecker struct {
	paths      netPaths
	interfaces func() ([]net.Interface, error)
	addrs      func(net.Interface) ([]net.Addr, error)
	// probe asks the resolver at addr for agentproto.ReadinessName and
	// returns nil once any answer arrived.
	probe func(ctx context.Context, resolver netip.AddrPort) error
}

func defaultNetChecker() *netChecker {
	return &netChecker{
		paths:      defaultNetPaths,
		interfaces: net.Interfaces,
		addrs:      func(i net.Interface) ([]net.Addr, error) { return i.Addrs() },
		probe:      probeResolver,
	}
}

// wait checks the network every netPollInterval until it is ready or
// timeout has passed, and reports the last state.
func (c *netChecker) wait(ctx context.Context, timeout time.Duration) agentproto.NetReadyStatus {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		st := c.check(ctx)
		st.WaitedMS = time.Since(t0).Milliseconds()
		if st.Ready || sleep(ctx, netPollInterval) != nil {
			return st
		}
	}
}

// check looks once: interface, address, default route, resolver.
func (c *netChecker) check(ctx context.Context) agentproto.NetReadyStatus {
	var st agentproto.NetReadyStatus
	ifaces, err := c.interfaces()
	if err != nil {
		st.Detail = "list interfaces: " + err.Error()
		return st
	}
	var iface *net.Interface
	var seen []string
	for i := range ifaces {
		in := ifaces[i]
		if in.Flags&net.FlagLoopback != 0 || len(in.HardwareAddr) != 6 {
			continue
		}
		seen = append(seen, in.Name)
		if in.Flags&net.FlagUp != 0 && in.Flags&net.FlagRunning != 0 {
			iface = &in
			break
		}
	}
	if iface == nil {
		if len(seen) == 0 {
			st.Detail = "the guest has no Ethernet interface"
		} else {
			st.Detail = "no Ethernet interface is up (" + strings.Join(seen, ", ") + " down)"
		}
		return st
	}
	st.Interface = iface.Name
	addrs, err := c.addrs(*iface)
	if err != nil {
		st.Detail = fmt.Sprintf("addresses of %s: %v", iface.Name, err)
		return st
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && p.Addr().IsGlobalUnicast() {
			st.Address = p.String()
			break
		}
	}
	if st.Address == "" {
		st.Detail = iface.Name + " has no IPv4 address yet (DHCP)"
		return st
	}
	gw, err := defaultRoute(c.paths.route, iface.Name)
	if err != nil {
		st.Detail = err.Error()
		return st
	}
	st.Gateway = gw.String()
	ns, err := firstNameserver(c.paths.resolvConf)
	if err != nil {
		st.Detail = err.Error()
		return st
	}
	st.Resolver = ns.String()
	pctx, cancel := context.WithTimeout(ctx, dnsProbeTimeout)
	defer cancel()
	if err := c.probe(pctx, netip.AddrPortFrom(ns, 53)); err != nil {
		st.Detail = fmt.Sprintf("resolver %s does not answer: %v", ns, err)
		return st
	}
	st.Ready = true
	return st
}

// defaultRoute finds the IPv4 default route through iface in a
// /proc/net/route table.
func defaultRoute(path, iface string) (netip.Addr, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("routes: %w", err)
	}
	return parseDefaultRoute(b, iface)
}

// parseDefaultRoute reads /proc/net/route: Iface, Destination, Gateway and
// Flags, addresses in host byte order as hex.
func parseDefaultRoute(table []byte, iface string) (netip.Addr, error) {
	const rtfUp, rtfGateway = 0x1, 0x2
	sc := bufio.NewScanner(bytes.NewReader(table))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[0] != iface || f[1] != "00000000" {
			continue
		}
		gw, err1 := hex.DecodeString(f[2])
		flags, err2 := hex.DecodeString(fmt.Sprintf("%08s", f[3]))
		if err1 != nil || err2 != nil || len(gw) != 4 || len(flags) != 4 {
			continue
		}
		if binary.BigEndian.Uint32(flags)&(rtfUp|rtfGateway) != rtfUp|rtfGateway {
			continue
		}
		// The kernel prints the address as a host-order (little-endian)
		// number: bytes reversed.
		return netip.AddrFrom4([4]byte{gw[3], gw[2], gw[1], gw[0]}), nil
	}
	return netip.Addr{}, fmt.Errorf("no default route through %s yet", iface)
}

// firstNameserver returns the first nameserver of a resolv.conf.
func firstNameserver(path string) (netip.Addr, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("resolver: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				return a.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, fmt.Errorf("%s names no nameserver", path)
}

// dnsQuery builds a query for name (type A, class IN, recursion desired).
func dnsQuery(id uint16, name string) []byte {
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD; one question
	for label := range strings.SplitSeq(strings.TrimSuffix(name, "."), ".") {
		q = append(q, byte(len(label)))
		q = append(q, label...)
	}
	return append(q, 0, 0, 1, 0, 1) // root, type A, class IN
}

// isAnswerTo reports whether resp is a DNS response to the query with id.
func isAnswerTo(resp []byte, id uint16) bool {
	return len(resp) >= 12 && binary.BigEndian.Uint16(resp) == id && resp[2]&0x80 != 0
}

// probeResolver sends one query for agentproto.ReadinessName to resolver
// and waits for its answer (any answer: the point is that the resolver
// path works).
func probeResolver(ctx context.Context, resolver netip.AddrPort) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", resolver.String())
	if err != nil {
		return err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	var idb [2]byte
	_, _ = rand.Read(idb[:])
	id := binary.BigEndian.Uint16(idb[:])
	if _, err := c.Write(dnsQuery(id, agentproto.ReadinessName)); err != nil {
		return err
	}
	buf := make([]byte, 1500)
	for {
		n, err := c.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return errors.New("no answer")
			}
			return err
		}
		if isAnswerTo(buf[:n], id) {
			return nil
		}
	}
}

// netReady handles a CallNetReady.
func (s *server) netReady(ctx context.Context, args []byte) (*agentproto.NetReadyStatus, error) {
	var req agentproto.NetReady
	if err := req.UnmarshalBinary(args); err != nil {
		return nil, fmt.Errorf("decode net ready: %w", err)
	}
	if req.TimeoutMS <= 0 || req.TimeoutMS > agentproto.MaxNetReadyTimeout {
		return nil, fmt.Errorf("decode net ready: timeout_ms %d out of range (1..%d)", req.TimeoutMS, agentproto.MaxNetReadyTimeout)
	}
	c := s.cfg.netChecker
	if c == nil {
		c = defaultNetChecker()
	}
	st := c.wait(ctx, time.Duration(req.TimeoutMS)*time.Millisecond)
	if st.Ready {
		s.log.Info("network ready", "interface", st.Interface, "address", st.Address, "waited_ms", st.WaitedMS)
	} else {
		s.log.Warn("network not ready", "detail", st.Detail, "waited_ms", st.WaitedMS)
	}
	return &st, nil
}
