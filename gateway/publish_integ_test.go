package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

const publishTestPolicy = `version = 1
[[profile]]
name = "test"
match = { any = true }
allow_shell = true
max_vms = 2
[profile.network]
mode = "allowlist"
allow = ["deb.debian.org:80"]
[profile.sessions]
allowed = true
publish = true
`

// TestGateway_Publish: the daemon's side of a published port, in this
// process (under -race in make test): concurrent connections into a
// session's web server, then the session's end while a connection is
// held: the forward tells its publisher why, the held connection is cut
// and its record says so.
func TestGateway_Publish(t *testing.T) {
	d := gatewaytest.Start(t, publishTestPolicy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 0, testutil.TemplateDir(t)
	})
	serve := `mkdir -p /tmp/www && echo page > /tmp/www/index.html && cd /tmp/www && python3 -c '
import http.server as h, os
s = h.ThreadingHTTPServer(("0.0.0.0", 8000), h.SimpleHTTPRequestHandler)
if os.fork(): os._exit(0)
os.setsid()
fd = os.open("/dev/null", os.O_RDWR)
for i in (0, 1, 2): os.dup2(fd, i)
s.serve_forever()'`
	if res, so, se := d.MustExec(t, wire.ExecRequest{Argv: []string{serve}, Shell: true, Session: "web"}, nil); res.ExitCode != 0 {
		t.Fatalf("guest server: %+v %q %q", res, so, se)
	}
	h, err := client.PublishSpec{Addr: netip.MustParseAddrPort("127.0.0.1:0"), GuestPort: 8000}.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ready := make(chan wire.Published, 1)
	type ended struct {
		pub *wire.Published
		err error
	}
	end := make(chan ended, 1)
	go func() {
		pub, err := d.Client.Publish(context.Background(), "web", 8000, h, func(p wire.Published) { ready <- p })
		end <- ended{pub, err}
	}()
	var pub wire.Published
	select {
	case pub = <-ready:
	case e := <-end:
		t.Fatalf("publish: %+v %v", e.pub, e.err)
	}
	if pub.Host != h.Addr() || pub.GuestPort != 8000 || pub.MaxConns != 16 {
		t.Fatalf("published %+v, listener %s", pub, h.Addr())
	}

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := hc.Get("http://" + pub.Host + "/index.html")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != "page\n" {
					err = fmt.Errorf("body %q", b)
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a concurrent request: %v", err)
		}
	}

	held, err := net.Dial("tcp", pub.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// The first byte of a request: the relay is up once the guest's
	// server answers a request, so one is sent whole, kept alive.
	if _, err := io.WriteString(held, "GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = held.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := held.Read(make([]byte, 512)); n == 0 {
		t.Fatalf("held connection: %v", err)
	}
	if err := d.Client.EndSession(context.Background(), "web"); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-end:
		if e.err != nil || e.pub == nil || e.pub.State != wire.PublishEnded || !strings.Contains(e.pub.Why, "the session ended") {
			t.Errorf("publish ended with %+v, %v", e.pub, e.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the forward outlived its session")
	}
	if _, err := io.ReadAll(held); err != nil && !errors.Is(err, io.EOF) && !strings.Contains(err.Error(), "reset") {
		t.Errorf("the held connection after the end: %v", err)
	}
	if _, err := net.Dial("tcp", pub.Host); err == nil {
		t.Error("the port still accepts after the session's end")
	}
	// One record per connection. The held one was cut by the end; a
	// concurrent request's may have been too: its client had read the
	// whole page and closed, but the relay's end can come after the
	// session's (then its record says cut, with the page's bytes).
	recs := testutil.JSONLines[audit.Record](t, d.AuditPath)
	allowed, heldCut := 0, false
	for _, r := range recs {
		if r.Kind != audit.KindNet || r.Net == nil || r.Net.Proto != "forward" || r.Verdict != audit.VerdictAllow {
			continue
		}
		allowed++
		if r.Net.Peer == held.LocalAddr().String() {
			heldCut = strings.Contains(r.Reason, "cut: the session ended")
		} else if strings.Contains(r.Reason, "cut") && r.Net.BytesOut == 0 {
			t.Errorf("a concurrent request's connection was cut before its page: %+v %+v", r, r.Net)
		}
	}
	if allowed != 9 || !heldCut {
		t.Errorf("forward records: %d allowed, the held one cut by the end: %v; want 9, true", allowed, heldCut)
	}
}
