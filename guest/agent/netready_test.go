package agent

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// A /proc/net/route of a guest with a DHCP lease (eth0, gateway 10.0.2.2).
const routeTable = `Iface	Destination	Gateway 	Flags	RefCnt	Use	Metric	Mask		MTU	Window	IRTT
eth0	00000000	0202000A	0003	0	0	1024	00000000	0	0	0
eth0	0002000A	00000000	0001	0	0	0	00FFFFFF	0	0	0
`

func TestParseDefaultRoute(t *testing.T) {
	for _, c := range []struct {
		name, table, iface string
		want               string // "" means an error
	}{
		{"lease", routeTable, "eth0", "10.0.2.2"},
		{"other interface", routeTable, "eth1", ""},
		{"no default", "Iface\tDestination\tGateway\tFlags\neth0\t0002000A\t00000000\t0001\n", "eth0", ""},
		{"default route down", "eth0\t00000000\t0202000A\t0002\n", "eth0", ""},
		{"garbage", "eth0 00000000 zz 0003\neth0 00000000\n", "eth0", ""},
		{"empty", "", "eth0", ""},
	} {
		got, err := parseDefaultRoute([]byte(c.table), c.iface)
		switch {
		case c.want == "" && err == nil:
			t.Errorf("%s: got %v, want an error", c.name, got)
		case c.want != "" && (err != nil || got.String() != c.want):
			t.Errorf("%s: got %v, %v; want %s", c.name, got, err, c.want)
		}
	}
}

func TestFirstNameserver(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ text, want string }{
		{"nameserver 10.0.2.3\noptions timeout:2 attempts:2\n", "10.0.2.3"},
		{"# comment\nsearch example\nnameserver bogus\nnameserver 10.0.2.3\nnameserver 10.0.2.4\n", "10.0.2.3"},
		{"options rotate\n", ""},
		{"", ""},
	} {
		p := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(p, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := firstNameserver(p)
		if c.want == "" {
			if err == nil {
				t.Errorf("%q: got %v, want an error", c.text, got)
			}
			continue
		}
		if err != nil || got.String() != c.want {
			t.Errorf("%q: got %v, %v; want %s", c.text, got, err, c.want)
		}
	}
	if _, err := firstNameserver(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing resolv.conf is not an error")
	}
}

func TestDNSQuery(t *testing.T) {
	q := dnsQuery(0xbeef, agentproto.ReadinessName+".")
	want := "\xbe\xef\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05ready\x06vmgate\x07invalid\x00\x00\x01\x00\x01"
	if string(q) != want {
		t.Errorf("query %q, want %q", q, want)
	}
	if isAnswerTo(q, 0xbeef) {
		t.Error("the query itself counts as an answer")
	}
	resp := append([]byte(nil), q...)
	resp[2] |= 0x80
	resp[3] = 0x83 // NXDOMAIN is an answer too
	if !isAnswerTo(resp, 0xbeef) || isAnswerTo(resp, 0xbeee) || isAnswerTo(resp[:11], 0xbeef) {
		t.Error("isAnswerTo misjudges a response")
	}
}

// fakeNet is a guest network whose state a test changes while the check
// polls it.
type fakeNet struct {
	mu       sync.Mutex
	up       bool
	addr     string
	resolver error
	probes   int
}

func (f *fakeNet) checker(t *testing.T) *netChecker {
	dir := t.TempDir()
	route := filepath.Join(dir, "route")
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(route, []byte(routeTable), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(resolv, []byte("nameserver 10.0.2.3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &netChecker{
		paths: netPaths{route: route, resolvConf: resolv},
		interfaces: func() ([]net.Interface, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			lo := net.Interface{Name: "lo", Flags: net.FlagUp | net.FlagRunning | net.FlagLoopback}
			eth := net.Interface{Name: "eth0", HardwareAddr: net.HardwareAddr{0x52, 0x54, 0, 0x12, 0x34, 0x56}}
			if f.up {
				eth.Flags = net.FlagUp | net.FlagRunning
			}
			return []net.Interface{lo, eth}, nil
		},
		addrs: func(net.Interface) ([]net.Addr, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.addr == "" {
				return nil, nil
			}
			p := netip.MustParsePrefix(f.addr)
			return []net.Addr{&net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}, nil
		},
		probe: func(_ context.Context, ns netip.AddrPort) error {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.probes++
			if ns.String() != "10.0.2.3:53" {
				return errors.New("probed " + ns.String())
			}
			return f.resolver
		},
	}
}

func (f *fakeNet) set(fn func(*fakeNet)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func TestNetCheckSaysWhatIsMissing(t *testing.T) {
	f := &fakeNet{}
	c := f.checker(t)
	ctx := context.Background()
	for _, step := range []struct {
		change func(*fakeNet)
		detail string // "" means ready
	}{
		{func(*fakeNet) {}, "no Ethernet interface is up (eth0 down)"},
		{func(f *fakeNet) { f.up = true }, "eth0 has no IPv4 address yet (DHCP)"},
		{func(f *fakeNet) { f.addr = "10.0.2.15/24"; f.resolver = errors.New("no answer") }, "resolver 10.0.2.3 does not answer: no answer"},
		{func(f *fakeNet) { f.resolver = nil }, ""},
	} {
		f.set(step.change)
		st := c.check(ctx)
		if st.Ready != (step.detail == "") || st.Detail != step.detail {
			t.Errorf("got ready=%v %q, want %q", st.Ready, st.Detail, step.detail)
		}
	}
	st := c.check(ctx)
	if st.Interface != "eth0" || st.Address != "10.0.2.15/24" || st.Gateway != "10.0.2.2" || st.Resolver != "10.0.2.3" {
		t.Errorf("ready status: %+v", st)
	}
}

func TestNetCheckWaits(t *testing.T) {
	f := &fakeNet{up: true}
	c := f.checker(t)
	go func() {
		time.Sleep(100 * time.Millisecond)
		f.set(func(f *fakeNet) { f.addr = "10.0.2.15/24" })
	}()
	st := c.wait(context.Background(), testTimeout)
	if !st.Ready || st.WaitedMS < 100 {
		t.Errorf("wait: %+v, want ready after >= 100 ms", st)
	}
	// Never ready: the wait ends at its timeout with what is missing.
	f.set(func(f *fakeNet) { f.addr = "" })
	t0 := time.Now()
	st = c.wait(context.Background(), 150*time.Millisecond)
	if st.Ready || !strings.Contains(st.Detail, "no IPv4 address") || time.Since(t0) > testTimeout {
		t.Errorf("wait on a network that never comes up: %+v after %v", st, time.Since(t0))
	}
}

func TestNetReadyRequest(t *testing.T) {
	t.Parallel()
	f := &fakeNet{up: true, addr: "10.0.2.15/24"}
	a := startAgent(t, func(c *Config) { c.netChecker = f.checker(t) })
	c := a.dial(t)
	var st agentproto.NetReadyStatus
	if err := c.Call(t.Context(), agentproto.CallNetReady, agentproto.NetReady{TimeoutMS: 5000}, &st); err != nil {
		t.Fatalf("net ready: %v", err)
	}
	if !st.Ready || st.Address != "10.0.2.15/24" {
		t.Fatalf("reply %+v", st)
	}
	for _, bad := range []wire{
		nil,
		encode(agentproto.NetReady{TimeoutMS: 0}),
		encode(agentproto.NetReady{TimeoutMS: 300001}),
		append(encode(agentproto.NetReady{TimeoutMS: 5}), 1),
	} {
		var ce *agentconn.CallError
		if err := c.Call(t.Context(), agentproto.CallNetReady, bad, nil); !errors.As(err, &ce) {
			t.Errorf("argument %q: %v, want refusal", bad, err)
		}
	}
}
