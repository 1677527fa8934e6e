package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
)

// round4Policy: sessions with a network to a.test, published ports that
// idle out after 2 s, one paused session per caller, root in the guest.
const round4Policy = `version = 1
[[profile]]
name = "test"
match = { any = true }
user = "root"
allow_shell = true
max_vms = 8
max_vms_per_caller = 8
[profile.sessions]
allowed = true
max_paused = 1
publish = true
publish_idle = "2s"
[profile.network]
mode = "allowlist"
allow = ["a.test:80"]
`

// TestGateway_Round4 runs, through one daemon, what a caller, a local
// process and a hostile guest could still do to the sessions of others
// (issue 43): pauses sent at once past the budget, a reload that did not
// reach running sessions and forks, a flood of connections to a published
// port, and guests that stop their agent before a stop. Nothing is lost
// that should not be.
func TestGateway_Round4(t *testing.T) {
	testutil.RequiresImage(t)
	inet := testutil.RequiresInternet(t)
	var hits atomic.Int64
	ln := inet.Listen(t, 80)
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1); _, _ = io.WriteString(w, "hi\n") }))
	}()
	// A long grace: a stop that waits on hostile guests shows as one
	// that takes it.
	const grace = 30 * time.Second
	d := gatewaytest.Start(t, round4Policy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 0, testutil.TemplateDir(t)
		c.MaxVMs, c.Grace = 8, grace
		c.NetHosts = map[string][]netip.Addr{"a.test": {inet.Addr}, "b.test": {inet.Addr}}
		c.AuditFlood = gateway.AuditFlood{DenyRate: 10, DenyBurst: 100, NetRate: 1, NetBurst: 10}
	})
	ctx := context.Background()
	sh := func(session, cmd string) string {
		t.Helper()
		res, so, se := d.MustExec(t, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: session}, nil)
		if res.ExitCode != 0 {
			t.Fatalf("%s in %s: %+v %q %q", cmd, session, res, so, se)
		}
		return so
	}
	end := func(names ...string) {
		for _, n := range names {
			if err := d.Client.EndSession(ctx, n); err != nil {
				t.Errorf("end %s: %v", n, err)
			}
		}
	}

	// Finding 5: pauses sent together each see the others under way.
	t.Run("pauses at once within the budget", func(t *testing.T) {
		sh("p1", "true")
		sh("p2", "true")
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, n := range []string{"p1", "p2"} {
			wg.Go(func() { _, errs[i] = d.Client.PauseSession(ctx, n) })
		}
		wg.Wait()
		paused, refused := 0, ""
		for i, err := range errs {
			switch {
			case err == nil:
				paused++
			case strings.Contains(err.Error(), "sessions.max_paused"):
				refused = []string{"p1", "p2"}[i]
			default:
				t.Errorf("pause: %v", err)
			}
		}
		if paused != 1 || refused == "" {
			t.Fatalf("two pauses at once under max_paused = 1: %d paused, refused %q (%v)", paused, refused, errs)
		}
		if out := sh(refused, "echo still here"); out != "still here\n" {
			t.Errorf("the refused session after its pause: %q", out)
		}
		end("p1", "p2")
	})

	// Finding 6: a reload reaches a running session's network at once,
	// and a fork made after it gets the policy in force.
	t.Run("a reload reaches running sessions and forks", func(t *testing.T) {
		sh("net", `setsid sh -c 'while :; do curl -s -m 2 -o /dev/null http://a.test/; sleep 0.2; done' </dev/null >/dev/null 2>&1 &`)
		waitFor(t, 60*time.Second, "the guest's loop to reach a.test", func() bool { return hits.Load() > 0 })
		setPolicy(t, d, strings.Replace(round4Policy, `allow = ["a.test:80"]`, `allow = ["b.test:80"]`, 1))
		if recs := sessionRecords(t, d.AuditPath, "net", "network re-decided"); len(recs) != 1 || !strings.Contains(recs[0].Message, "allow [b.test:80]") {
			t.Fatalf("the reload's record of the session's network: %+v", recs)
		}
		quiet := func(what string) {
			t.Helper()
			n := hits.Load()
			time.Sleep(3 * time.Second) // the guest's loop tries ~10 times
			if got := hits.Load() - n; got > 1 {
				t.Errorf("%s: the guest reached a.test %d times in 3 s, which the reloaded policy no longer allows", what, got)
			}
		}
		quiet("after the reload, without a command")
		if _, err := d.Client.ForkSession(ctx, "net", []string{"net-copy"}); err != nil {
			t.Fatal(err)
		}
		quiet("after a fork (its copy runs the loop too)")
		end("net", "net-copy")
		setPolicy(t, d, round4Policy)
	})

	// Finding 4: a published port's connections at a local process's
	// pace are bounded and counted, and an idle one is cut.
	t.Run("a flood of connections to a published port", func(t *testing.T) {
		// The server listens before the command ends: it binds, then
		// forks into the background.
		sh("web", `cd /tmp && python3 -c '
import http.server as h, os
s = h.ThreadingHTTPServer(("0.0.0.0", 8000), h.SimpleHTTPRequestHandler)
if os.fork(): os._exit(0)
os.setsid()
fd = os.open("/dev/null", os.O_RDWR)
for i in (0, 1, 2): os.dup2(fd, i)
s.serve_forever()'`)
		h, err := client.PublishSpec{Addr: netip.MustParseAddrPort("127.0.0.1:0"), GuestPort: 8000}.Listen()
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		pctx, stop := context.WithCancel(ctx)
		ready, done := make(chan wire.Published, 1), make(chan error, 1)
		go func() {
			_, err := d.Client.Publish(pctx, "web", 8000, h, func(p wire.Published) { ready <- p })
			done <- err
		}()
		var pub wire.Published
		select {
		case pub = <-ready:
		case err := <-done:
			t.Fatalf("publish: %v", err)
		}
		// An idle connection is cut after publish_idle.
		c, err := net.Dial("tcp", pub.Host)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, rerr := c.Read(make([]byte, 1))
		c.Close()
		if took := time.Since(t0); rerr == nil || took < 2*time.Second || took > 20*time.Second {
			t.Errorf("an idle connection: %v after %v, want it cut after 2 s", rerr, took)
		}
		flood := 0
		for range 300 {
			if c, err := net.Dial("tcp", pub.Host); err == nil {
				c.Close()
				flood++
			}
		}
		// A dial succeeds once the kernel queues the connection on the
		// caller's listening socket, before the daemon accepts it; what
		// the daemon has not taken when the publication ends stays in
		// the caller's socket, never the daemon's, and is rightly not
		// recorded. The daemon takes connections in their order, so a
		// last one that it answers (refused: closed at once; forwarded:
		// the guest's reply, then its close) was taken after every dial
		// above.
		// Its end (EOF, or a reset, even before the dial returns) is the
		// answer; only the deadline is not.
		last, err := net.Dial("tcp", pub.Host)
		switch {
		case err == nil:
			_ = last.SetDeadline(time.Now().Add(60 * time.Second))
			_, _ = io.WriteString(last, "GET / HTTP/1.0\r\n\r\n")
			if _, err := io.Copy(io.Discard, last); errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the last connection: never answered: %v", err)
			}
			last.Close()
			flood++
		case !errors.Is(err, syscall.ECONNRESET):
			t.Fatalf("the last connection: %v", err)
		}
		stop()
		<-done
		// The daemon ends the forward once the publisher is gone, and
		// writes the summaries of what it held back with its end.
		waitFor(t, 30*time.Second, "the forward's end", func() bool { return len(sessionRecords(t, d.AuditPath, "web", "unpublished")) > 0 })
		var one, summed int
		count := regexp.MustCompile(`^(\d+) more (forwarded connections|refused network events) not recorded one by one`)
		for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
			if r.Kind != audit.KindNet || r.Session != "web" || r.RequestID != pub.RequestID {
				continue
			}
			if m := count.FindStringSubmatch(r.Message); m != nil {
				n, _ := strconv.Atoi(m[1])
				summed += n
				continue
			}
			if r.Net != nil && r.Net.Proto == "forward" {
				one++
			}
		}
		// A dial the daemon reset as it returned may fail here: each of
		// the 301 that reached the daemon is counted once, at least the
		// dials that succeeded (and the idle connection).
		if one+summed < flood+1 || one+summed > 302 {
			t.Errorf("%d forwarded connections recorded one by one and %d in summaries, want %d to 302 in all", one, summed, flood+1)
		}
		if one > 60 {
			t.Errorf("%d of %d connections recorded one by one: the flood gates bound them to their bursts and rates", one, flood+1)
		}
		end("web")
	})

	// Finding 7: guests that stop their agent cost their own sessions,
	// not another's pause at the stop.
	t.Run("a stop pauses every session in time, whatever guests do", func(t *testing.T) {
		// Each hostile guest stops its agent once its command is over,
		// and says so on its console, which the test reads from the host.
		var consoles []string
		for _, s := range []string{"h1", "h2"} {
			res, _, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{`setsid sh -c 'sleep 1; pkill -STOP -x vmgate-agent && echo vmgate-test-agent-stopped > /dev/console' </dev/null >/dev/null 2>&1 &`},
				Shell: true, Session: s}, nil)
			consoles = append(consoles, filepath.Join(d.Config.VM.StateDir, "vms", res.VMID, vm.ConsoleLog))
		}
		sh("n", "echo kept > /root/kept")
		for _, c := range consoles {
			waitFor(t, 60*time.Second, "a hostile guest to stop its agent", func() bool {
				b, _ := os.ReadFile(c)
				return strings.Contains(string(b), "vmgate-test-agent-stopped")
			})
		}
		t0 := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- d.Stop() }()
		select {
		case <-stopped:
		case <-time.After(grace + 60*time.Second):
			t.Fatal("the daemon did not stop")
		}
		// Each hostile guest costs its own session a hand-back's bound
		// (5 s), in parallel, and the well-behaved one a pause: far less
		// than the grace period, which a stop used to wait out (and lose
		// every session after the two whose agents were stopped).
		if took := time.Since(t0); took > 20*time.Second {
			t.Errorf("the stop took %v: hostile guests held its pause workers", took)
		}
		var rec struct{ State string }
		b, err := os.ReadFile(filepath.Join(sessionDirOf(t, d.Config.VM.StateDir, "n"), "session.json"))
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || rec.State != wire.SessionPaused {
			t.Errorf("the well-behaved session after the stop: %q %v", rec.State, err)
		}
		if notes, _ := filepath.Glob(filepath.Join(d.Config.VM.StateDir, "lost", "*.json")); len(notes) != 2 {
			t.Errorf("%d lost notes, want the two sessions whose guests stopped their agents", len(notes))
		}
	})
}
