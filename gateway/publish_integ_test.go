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

	// hold opens a connection whose relay is up: the guest's server has
	// answered a request on it, and it is kept alive.
	hold := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", pub.Host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if n, err := c.Read(make([]byte, 512)); n == 0 {
			t.Fatalf("held connection: %v", err)
		}
		return c
	}
	// A pause cuts what is open; a connection after the resume is
	// carried whole, and its record does not say the pause cut it.
	paused := hold()
	if _, err := d.Client.PauseSession(context.Background(), "web"); err != nil {
		t.Fatal(err)
	}
	d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "web"}, nil)
	after := hold()
	after.Close()

	held := hold()
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
	allowed := 0
	why := map[string]string{}
	for _, r := range recs {
		if r.Kind != audit.KindNet || r.Net == nil || r.Net.Proto != "forward" || r.Verdict != audit.VerdictAllow {
			continue
		}
		allowed++
		why[r.Net.Peer] = r.Reason
		if strings.Contains(r.Reason, "cut") && r.Net.BytesOut == 0 {
			t.Errorf("a connection was cut before its page: %+v %+v", r, r.Net)
		}
	}
	if allowed != 11 {
		t.Errorf("%d forward records, want 11", allowed)
	}
	for c, want := range map[net.Conn]string{paused: "cut: the session was paused", held: "cut: the session ended"} {
		if got := why[c.LocalAddr().String()]; !strings.HasPrefix(got, want) {
			t.Errorf("the record of %s says %q, want %q", c.LocalAddr(), got, want)
		}
	}
	// (It may have been cut by the end, closing as the session ended;
	// never by the pause before it began.)
	if got := why[after.LocalAddr().String()]; strings.Contains(got, "paused") {
		t.Errorf("a connection made after the resume is recorded as %q", got)
	}
}

// TestGateway_PublishRevoked: a reload whose policy no longer allows a
// published port stops it, as a session's end does: the publisher is told
// why and the port refuses connections; the session lives on.
func TestGateway_PublishRevoked(t *testing.T) {
	d := gatewaytest.Start(t, publishTestPolicy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 0, testutil.TemplateDir(t)
	})
	d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "web"}, nil)
	h, err := client.PublishSpec{Addr: netip.MustParseAddrPort("127.0.0.1:0"), GuestPort: 8000}.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ready := make(chan wire.Published, 1)
	end := make(chan *wire.Published, 1)
	go func() {
		pub, err := d.Client.Publish(context.Background(), "web", 8000, h, func(p wire.Published) { ready <- p })
		if err != nil {
			t.Errorf("publish: %v", err)
		}
		end <- pub
	}()
	pub := <-ready
	setPolicy(t, d, strings.Replace(publishTestPolicy, "publish = true", "publish = false", 1))
	select {
	case e := <-end:
		if e == nil || e.State != wire.PublishEnded || !strings.Contains(e.Why, "no longer allows it (sessions.publish)") {
			t.Errorf("the forward ended with %+v", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the forward outlived the policy that allowed it")
	}
	if _, err := net.Dial("tcp", pub.Host); err == nil {
		t.Error("the port still accepts after the reload")
	}
	d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "web"}, nil)
}
