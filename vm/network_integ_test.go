package vm

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/guestnet"
)

// testInternet is a web server the guest reaches as allowed.test: names
// resolve to a documentation address (an ordinary public address to the
// rules), which the network's dial maps to the local server.
type testInternet struct {
	srv    *httptest.Server
	public netip.AddrPort
	mu     sync.Mutex
	recs   []guestnet.Record
}

func newTestInternet(t *testing.T) *testInternet {
	ti := &testInternet{}
	ti.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", r.Host)
	}))
	t.Cleanup(ti.srv.Close)
	real := netip.MustParseAddrPort(strings.TrimPrefix(ti.srv.URL, "http://"))
	ti.public = netip.AddrPortFrom(netip.MustParseAddr("198.51.100.10"), real.Port())
	return ti
}

func (ti *testInternet) config(t *testing.T) *guestnet.Config {
	rules, err := guestnet.ParseRules([]string{fmt.Sprintf("allowed.test:%d", ti.public.Port())})
	if err != nil {
		t.Fatal(err)
	}
	real := strings.TrimPrefix(ti.srv.URL, "http://")
	return &guestnet.Config{
		Rules: rules,
		Resolve: func(_ context.Context, name string) ([]netip.Addr, error) {
			switch name {
			case "allowed.test", "denied.test":
				return []netip.Addr{ti.public.Addr()}, nil
			}
			return nil, fmt.Errorf("no such host %s", name)
		},
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr != ti.public.String() {
				return nil, fmt.Errorf("test dial: unexpected %s", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, real)
		},
		Audit: func(r guestnet.Record) { ti.mu.Lock(); ti.recs = append(ti.recs, r); ti.mu.Unlock() },
	}
}

func (ti *testInternet) records() []guestnet.Record {
	ti.mu.Lock()
	defer ti.mu.Unlock()
	return append([]guestnet.Record(nil), ti.recs...)
}

// TestVM_Network boots a VM with a network and checks, from inside the
// guest with ordinary tools, what the network lets through.
func TestVM_Network(t *testing.T) {
	img := testutil.RequiresImage(t)
	ti := newTestInternet(t)
	opts := Options{ImageDir: img, StateDir: t.TempDir(), Accel: AccelAuto, Network: ti.config(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	if _, err := EnsureTemplate(ctx, opts); err == nil {
		t.Fatal("a template with a network was built; restores of those are not supported yet")
	}
	v, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	// The agent answers before networkd has the DHCP lease.
	if o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", "for i in $(seq 60); do ip -4 -o addr show scope global | grep -q 10.0.2.15 && exit 0; sleep 1; done; exit 1"}, Timeout: 2 * time.Minute}); o.res.ExitCode != 0 {
		t.Fatalf("no DHCP lease within a minute: %q", o.stderr)
	}
	url := fmt.Sprintf("http://allowed.test:%d/", ti.public.Port())
	sh := func(cmd string) execOut {
		return run(t, v, ExecRequest{Argv: []string{"sh", "-c", cmd}, Timeout: time.Minute})
	}
	t.Run("dhcp address", func(t *testing.T) {
		o := sh("ip -4 -o addr show scope global")
		if !strings.Contains(o.stdout, "10.0.2.15/24") {
			t.Fatalf("guest address: %q %q", o.stdout, o.stderr)
		}
	})
	t.Run("allowed name", func(t *testing.T) {
		o := sh("wget -q -U Mozilla -O- " + url)
		if o.res.ExitCode != 0 || o.stdout != fmt.Sprintf("hello from allowed.test:%d\n", ti.public.Port()) {
			t.Fatalf("wget: %+v %q %q", o.res, o.stdout, o.stderr)
		}
	})
	t.Run("name not allowed fails fast", func(t *testing.T) {
		t0 := time.Now()
		o := sh(fmt.Sprintf("wget -q -T 5 -O- http://denied.test:%d/", ti.public.Port()))
		if o.res.ExitCode == 0 || time.Since(t0) > 30*time.Second {
			t.Fatalf("denied name: %+v %q %q in %v", o.res, o.stdout, o.stderr, time.Since(t0))
		}
	})
	t.Run("direct address refused", func(t *testing.T) {
		// An address no allowed name resolved to, claiming an allowed name.
		o := sh(fmt.Sprintf("curl -sS -m 10 -H 'Host: allowed.test' http://198.51.100.99:%d/", ti.public.Port()))
		if o.res.ExitCode == 0 {
			t.Fatalf("direct IP: %q", o.stdout)
		}
	})
	t.Run("host header must match the resolved name", func(t *testing.T) {
		o := sh(fmt.Sprintf("curl -sS -m 10 -H 'Host: other.test' http://allowed.test:%d/", ti.public.Port()))
		if o.res.ExitCode == 0 || strings.Contains(o.stdout, "hello") {
			t.Fatalf("fronted request: %q", o.stdout)
		}
	})
	t.Run("host and gateway unreachable", func(t *testing.T) {
		for _, target := range []string{"10.0.2.2:22", "127.0.0.1:22", "169.254.169.254:80"} {
			o := sh("curl -sS -m 5 http://" + target + "/")
			if o.res.ExitCode == 0 {
				t.Errorf("%s reachable: %q", target, o.stdout)
			}
		}
	})
	recs := ti.records()
	var allowed, denied int
	for _, r := range recs {
		if r.Allowed {
			allowed++
		} else {
			denied++
		}
	}
	if allowed == 0 || denied == 0 {
		t.Errorf("audit records: %+v", recs)
	}
	t.Logf("%d audit records, %d allowed", len(recs), allowed)
}
