package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm/netstack"
)

// testInternet is a web server the guest reaches as allowed.test: names
// resolve to a documentation address (an ordinary public address to the
// rules), which the network's dial maps to the local server.
type testInternet struct {
	srv    *httptest.Server
	public netip.AddrPort
	mu     sync.Mutex
	recs   []netstack.Record
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

func (ti *testInternet) config(t *testing.T) *netstack.Config {
	rules, err := netrule.ParseRules([]string{fmt.Sprintf("allowed.test:%d", ti.public.Port())})
	if err != nil {
		t.Fatal(err)
	}
	real := strings.TrimPrefix(ti.srv.URL, "http://")
	cfg := &netstack.Config{
		Policy: netstack.Policy{Egress: netrule.Egress{Rules: rules}},
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
	}
	cfg.Audit = func(r netstack.Record) { ti.mu.Lock(); ti.recs = append(ti.recs, r); ti.mu.Unlock() }
	return cfg
}

func (ti *testInternet) records() []netstack.Record {
	ti.mu.Lock()
	defer ti.mu.Unlock()
	return append([]netstack.Record(nil), ti.recs...)
}

// TestVM_Network boots a VM with a network and checks, from inside the
// guest with ordinary tools, what the network lets through. The first
// command fetches a page at once: the VM is handed out only once its
// network works.
func TestVM_Network(t *testing.T) {
	img := testutil.RequiresImage(t)
	ti := newTestInternet(t)
	opts := Options{Runtime: Runtime{StateDir: t.TempDir(), Accel: AccelAuto}, ImageDir: img, Network: ti.config(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	v, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	t.Logf("cold boot with a network: %s", phasesString(v.Phases()))
	first := run(t, v, ExecRequest{Argv: []string{"wget", "-q", "-U", "Mozilla", "-O-", fmt.Sprintf("http://allowed.test:%d/", ti.public.Port())}, Timeout: time.Minute})
	if first.res.ExitCode != 0 || !strings.HasPrefix(first.stdout, "hello from allowed.test") {
		t.Fatalf("first command of a fresh VM: wget %+v %q %q", first.res, first.stdout, first.stderr)
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

	// A cold-booted VM saved for a fork runs on: QEMU reactivates its
	// disks on cont, which needs fadvise64 of the jail's seccomp filter
	// (a fork of a session whose VM booted before a template existed).
	sp, err := v.Save(ctx, filepath.Join(opts.StateDir, "fork"), SaveOptions{Keep: true, InMemory: true})
	if err != nil {
		t.Fatalf("save of a cold-booted VM that runs on: %v", err)
	}
	defer func() { _ = sp.Discard() }()
	if o := sh("echo after the save"); o.res.ExitCode != 0 || o.stdout != "after the save\n" {
		t.Fatalf("after the save: %+v %q %q", o.res, o.stdout, o.stderr)
	}
}

// TestTemplate_NetworkClones restores VMs with a NIC from a template. Each
// clone's first command reaches the allowed name at once; each clone has
// a network of its own (policy, resolved names, audit), so what one clone
// may reach another may not; the guest keeps its address and its lease
// across the restore (a DHCP renewal is answered by the clone's own
// network); and no clone needed a second try at its agent handshake.
func TestTemplate_NetworkClones(t *testing.T) {
	img := testutil.RequiresImage(t)
	ti := newTestInternet(t)
	allow := ti.config(t)
	opts := Options{Runtime: Runtime{StateDir: t.TempDir(), Accel: AccelAuto, TemplateDir: testutil.TemplateDir(t)}, ImageDir: img, Network: allow}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	tmpl, err := EnsureTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tmpl.Close()
	if !tmpl.Meta.Network {
		t.Fatalf("template without a NIC: %+v", tmpl.Meta)
	}
	url := fmt.Sprintf("http://allowed.test:%d/", ti.public.Port())

	a, err := tmpl.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var mu sync.Mutex
	var bRecs []netstack.Record
	b, err := tmpl.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// b's network allows nothing, and audits to its own list.
	b.Network().SetPolicy(netstack.Policy{Audit: func(r netstack.Record) { mu.Lock(); bRecs = append(bRecs, r); mu.Unlock() }})
	t.Logf("restored with a network: %s", phasesString(a.Phases()))

	sh := func(v *VM, cmd string) execOut {
		return run(t, v, ExecRequest{Argv: []string{"sh", "-c", cmd}, Timeout: time.Minute})
	}
	if o := sh(a, "wget -q -U Mozilla -O- "+url); o.res.ExitCode != 0 || !strings.HasPrefix(o.stdout, "hello from allowed.test") {
		t.Fatalf("first command of clone a: %+v %q %q", o.res, o.stdout, o.stderr)
	}
	// Clone a resolved the name and connected; clone b still may not.
	for _, cmd := range []string{
		"getent hosts allowed.test",
		"wget -q -T 5 -O- " + url,
		fmt.Sprintf("curl -sS -m 5 http://%s/", ti.public),
	} {
		if o := sh(b, cmd); o.res.ExitCode == 0 {
			t.Errorf("clone b (nothing allowed): %s succeeded: %q", cmd, o.stdout)
		}
	}
	mu.Lock()
	if len(bRecs) == 0 {
		t.Error("clone b's refusals were not audited on its own network")
	}
	for _, r := range bRecs {
		if r.Allowed {
			t.Errorf("clone b: allowed %+v", r)
		}
	}
	mu.Unlock()
	// Clone b's lookups were refused as off its (empty) allowlist; clone
	// a's audit, on another network, holds none of them.
	for _, r := range ti.records() {
		if strings.Contains(r.Reason, "not on the allowlist") {
			t.Errorf("clone a's audit holds clone b's traffic: %+v", r)
		}
	}

	// The lease survives the restore and the clone's network renews it.
	for name, v := range map[string]*VM{"a": a, "b": b} {
		o := sh(v, "ip -4 -o addr show dev eth0; networkctl renew eth0 && sleep 2; ip -4 -o addr show dev eth0")
		if o.res.ExitCode != 0 || strings.Count(o.stdout, "10.0.2.15/24") != 2 {
			t.Errorf("clone %s address across a renewal: %+v %q %q", name, o.res, o.stdout, o.stderr)
		}
	}
	if o := sh(a, "wget -q -O- "+url); o.res.ExitCode != 0 {
		t.Errorf("clone a after its renewal: %+v %q", o.res, o.stderr)
	}

	// A network that is not up is reported as such, saying what is
	// missing, within the limit (the check a VM passes before it is
	// handed out).
	if o := sh(b, "ip link set eth0 down"); o.res.ExitCode != 0 {
		t.Fatalf("link down: %+v %q", o.res, o.stderr)
	}
	t0 := time.Now()
	st, err := b.waitNetwork(ctx, 2*time.Second)
	if !errors.Is(err, ErrNetworkNotReady) || !strings.Contains(err.Error(), "eth0 down") || st == nil || st.Ready {
		t.Errorf("network down: %+v %v", st, err)
	}
	if d := time.Since(t0); d > time.Minute {
		t.Errorf("the check took %v with a 2 s limit", d)
	}

	// Clones restored side by side all answer on their first handshake.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 3)
	for i := range 6 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			v, err := tmpl.Restore(ctx)
			if err != nil {
				t.Errorf("clone %d: %v", i, err)
				return
			}
			defer v.Close()
			if res, err := v.Exec(ctx, ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
				t.Errorf("clone %d: %+v %v", i, res, err)
			}
		}()
	}
	wg.Wait()
	if n := tmpl.HandshakeFailures(); n != 0 {
		t.Errorf("%d clones failed their first agent handshake", n)
	}
}

// TestTemplate_RestoreStress restores VMGATE_STRESS_RESTORES clones (four
// at a time) of the template without a NIC and as many of the template
// with one; every clone must answer its first agent handshake and run a
// command. It measures the restore path under load (docs/fast-path.md) and
// is skipped unless the variable is set: a few minutes per 300 clones.
func TestTemplate_RestoreStress(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("VMGATE_STRESS_RESTORES"))
	if n <= 0 {
		t.Skip("VMGATE_STRESS_RESTORES not set")
	}
	img := testutil.RequiresImage(t)
	ti := newTestInternet(t)
	for _, nic := range []bool{false, true} {
		t.Run(fmt.Sprintf("nic=%v", nic), func(t *testing.T) {
			opts := Options{Runtime: Runtime{StateDir: t.TempDir(), Accel: AccelAuto, TemplateDir: testutil.TemplateDir(t)}, ImageDir: img}
			if nic {
				opts.Network = ti.config(t)
			}
			ctx := context.Background()
			tmpl, err := EnsureTemplate(ctx, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer tmpl.Close()
			var failed atomic.Int64
			sem := make(chan struct{}, 4)
			var wg sync.WaitGroup
			t0 := time.Now()
			for i := range n {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					v, err := tmpl.Restore(ctx)
					if err != nil {
						failed.Add(1)
						t.Errorf("restore %d: %v", i, err)
						return
					}
					defer v.Close()
					if res, err := v.Exec(ctx, ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
						failed.Add(1)
						t.Errorf("clone %d: %+v %v", i, res, err)
					}
				}()
			}
			wg.Wait()
			t.Logf("%d restores in %v: %d failed, %d first handshakes failed", n, time.Since(t0).Round(time.Second), failed.Load(), tmpl.HandshakeFailures())
			if tmpl.HandshakeFailures() != 0 {
				t.Errorf("%d clones failed their first agent handshake", tmpl.HandshakeFailures())
			}
		})
	}
}
