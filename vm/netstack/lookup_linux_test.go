package netstack

import (
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/vmgate/vmgate/internal/testutil"
)

// TestLookupHost_NoSearchDomains runs a lookup in private mount and
// network namespaces whose resolv.conf names a search domain and a DNS
// server of the test's own, which knows only
// nosuch.allowed.test.corp.example (an "internal" answer). The guest's
// name nosuch.allowed.test does not exist: the lookup must say so, and
// ask for nothing but the name itself, fully qualified.
func TestLookupHost_NoSearchDomains(t *testing.T) {
	if os.Getenv("GUESTNET_LOOKUP_CHILD") == "1" {
		lookupChild(t)
		return
	}
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(conf, []byte("nameserver 127.0.0.1\nsearch corp.example\noptions ndots:1 attempts:1 timeout:2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "--mount", "--net", "--", "sh", "-c",
		`mount --bind "$1" /etc/resolv.conf && ip link set lo up && exec "$2" -test.run '^TestLookupHost_NoSearchDomains$' -test.v`,
		"sh", conf, os.Args[0])
	cmd.Env = append(os.Environ(), "GUESTNET_LOOKUP_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestLookupHost_NoSearchDomains") {
		t.Fatalf("child did not pass:\n%s", out)
	}
	t.Logf("%s", out)
}

func lookupChild(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		mu.Lock()
		asked = append(asked, q.Question[0].Name)
		mu.Unlock()
		if q.Question[0].Name == "nosuch.allowed.test.corp.example." && q.Question[0].Qtype == dns.TypeA {
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.IPv4(10, 1, 2, 3)})
		} else if q.Question[0].Name != "nosuch.allowed.test.corp.example." {
			m.Rcode = dns.RcodeNameError
		}
		_ = w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:53")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	go func() { _ = srv.ActivateAndServe() }()
	defer srv.Shutdown()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The server works: the internal name resolves when asked for.
	if a, err := LookupHost(ctx, "nosuch.allowed.test.corp.example"); err != nil || len(a) != 1 || a[0] != netip.MustParseAddr("10.1.2.3") {
		t.Fatalf("internal name: %v %v", a, err)
	}
	mu.Lock()
	asked = nil
	mu.Unlock()
	a, err := LookupHost(ctx, "nosuch.allowed.test")
	if err == nil {
		t.Fatalf("the guest's name resolved through the host's search domain: %v", a)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, n := range asked {
		if n != "nosuch.allowed.test." {
			t.Errorf("asked for %q", n)
		}
	}
	if len(asked) == 0 {
		t.Error("the lookup asked the server nothing")
	}
}
