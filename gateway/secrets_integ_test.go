package gateway_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

// secretsPolicy: GH_TOKEN goes to api.test (HTTPS and HTTP), in
// Authorization only; other.test is allowed but bound to nothing;
// bad.test is bound, and serves a certificate no root vouches for. The
// secret file's path is %s.
const secretsPolicy = `version = 1
[[secret]]
name = "GH_TOKEN"
file = %q
hosts = ["api.test:443", "api.test:80", "bad.test:443"]
headers = ["Authorization"]
[[profile]]
name = "test"
match = { any = true }
user = "root"
allow_shell = true
max_vms = 4
max_vms_per_caller = 4
secrets = ["GH_TOKEN"]
[profile.sessions]
allowed = true
[profile.network]
mode = "allowlist"
allow = ["api.test:443", "api.test:80", "other.test:80", "other.test:443", "bad.test:443"]
`

// seen is what the test's servers were sent: per host, the
// Authorization field and the body of each request.
type seen struct {
	mu   sync.Mutex
	reqs []string
}

func (s *seen) handler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.reqs = append(s.reqs, fmt.Sprintf("%s %s %s auth=%q body=%q", r.Proto, r.Host, r.URL.Path, r.Header.Get("Authorization"), body))
	s.mu.Unlock()
	_, _ = io.WriteString(w, "served "+r.URL.Path+"\n")
}

// since returns what was sent after the first n requests.
func (s *seen) since(n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs[n:]...)
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// TestGateway_Secrets (issue 47): a session's command holds a
// placeholder, and the server of the secret's host gets the value over
// HTTPS (the netstack's interception, verified against the test's CA)
// and HTTP; the placeholder to another host, in a body or to a host whose
// certificate does not verify is refused and audited; a fork and a
// resumed session keep working placeholders while the save point holds
// no value; a reload that changes the value carries the new one; a
// secret outside the profile is refused (201). The value is never in
// the guest's output, the audit log, the daemon's log or the save point.
func TestGateway_Secrets(t *testing.T) {
	testutil.RequiresImage(t)
	inet := testutil.RequiresInternet(t)
	// The test's CA and a rogue one: session CAs serve as any.
	ca, err := netstack.NewSessionCA("test")
	if err != nil {
		t.Fatal(err)
	}
	rogue, err := netstack.NewSessionCA("rogue")
	if err != nil {
		t.Fatal(err)
	}
	certs := map[string]*netstack.SessionCA{"api.test": ca, "other.test": ca, "bad.test": rogue}
	var got seen
	tlsLn := tls.NewListener(inet.Listen(t, 443), &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
		c, ok := certs[h.ServerName]
		if !ok {
			return nil, fmt.Errorf("no certificate for %q", h.ServerName)
		}
		return c.Leaf(h.ServerName)
	}, NextProtos: []string{"h2", "http/1.1"}})
	for _, ln := range []net.Listener{tlsLn, inet.Listen(t, 80)} {
		srv := &http.Server{Handler: http.HandlerFunc(got.handler), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
	}

	dir := t.TempDir()
	secretFile := filepath.Join(dir, "gh")
	const value, value2 = "ghp_TESTVALUE_0123456789abcdef", "ghp_ROTATED_fedcba9876543210"
	if err := os.WriteFile(secretFile, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	roots := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(roots, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	// A world-readable value refuses the policy at start: no daemon.
	loose := filepath.Join(dir, "loose")
	if err := os.WriteFile(loose, []byte(value), 0o644); err != nil {
		t.Fatal(err)
	}
	polPath := filepath.Join(dir, "loose.toml")
	if err := os.WriteFile(polPath, []byte(fmt.Sprintf(secretsPolicy, loose)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = gateway.New(gateway.Config{Socket: filepath.Join(dir, "s.sock"), VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: filepath.Join(dir, "state")}, ImageDir: testutil.RequiresImage(t), NoTemplate: true},
		AuditPath: filepath.Join(dir, "audit.jsonl"), PolicyPath: polPath, PolicyExplicit: true, AllowRoot: true})
	if err == nil || !strings.Contains(err.Error(), `secret "GH_TOKEN": `+loose+": mode 0644 lets others read it") || strings.Contains(err.Error(), value) {
		t.Fatalf("a world-readable secret at start: %v", err)
	}

	var daemonLog bytes.Buffer
	var logMu sync.Mutex
	state := t.TempDir()
	d := gatewaytest.Start(t, fmt.Sprintf(secretsPolicy, secretFile), func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir, c.VM.StateDir = false, 0, testutil.TemplateDir(t), state
		c.MaxVMs, c.Grace = 4, 10*time.Second
		c.VM.SecretRoots = roots
		c.NetHosts = map[string][]netip.Addr{"api.test": {inet.Addr}, "other.test": {inet.Addr}, "bad.test": {inet.Addr}}
		c.Log = slog.New(slog.NewJSONHandler(&lockedWriter{w: &daemonLog, mu: &logMu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	run := func(want int, args ...string) string {
		t.Helper()
		so, se, code := vmExec(t, d.Socket, "", args...)
		if code != want {
			t.Fatalf("vm-exec %q: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, want, so, se)
		}
		if strings.Contains(so+se, value) || strings.Contains(so+se, value2) {
			t.Fatalf("the value reached the guest's output: %s %s", so, se)
		}
		return so + se
	}
	curl := func(url string, extra ...string) string {
		return strings.Join(append([]string{`curl -sS --max-time 20 -H "Authorization: Bearer $GH_TOKEN"`}, append(extra, url)...), " ")
	}
	sentOnce := func(n int, want string) {
		t.Helper()
		reqs := got.since(n)
		if len(reqs) != 1 || !strings.Contains(reqs[0], want) {
			t.Fatalf("the server got %q; want one request with %q", reqs, want)
		}
	}

	// The placeholder, in the guest; the value, at api.test's server.
	n := got.count()
	out := run(0, "--session", "s", "--secret", "GH_TOKEN", "-c", `echo "$GH_TOKEN" > /root/placeholder; echo "var=$GH_TOKEN"; `+curl("https://api.test/one"))
	if !strings.Contains(out, "var=vmgate_secret_") || !strings.Contains(out, "served /one") {
		t.Fatalf("HTTPS with the placeholder: %s", out)
	}
	sentOnce(n, `HTTP/1.1 api.test /one auth="Bearer `+value+`"`)
	placeholder := strings.TrimSpace(strings.SplitN(strings.SplitN(out, "var=", 2)[1], "\n", 2)[0])

	t.Run("plain HTTP to the bound host", func(t *testing.T) {
		n := got.count()
		run(0, "--session", "s", "-c", curl("http://api.test/plain"))
		sentOnce(n, `api.test /plain auth="Bearer `+value+`"`)
	})
	t.Run("the placeholder elsewhere is refused", func(t *testing.T) {
		n := got.count()
		// Another allowed host, plain HTTP: cut before a byte of it goes.
		out := run(0, "--session", "s", "-c", curl("http://other.test/leak")+"; echo curl=$?")
		if strings.Contains(out, "curl=0") {
			t.Errorf("the placeholder went to other.test: %s", out)
		}
		// The bound host, in the body.
		out = run(0, "--session", "s", "-c", `curl -sS --max-time 20 -d "token=$GH_TOKEN" https://api.test/body; echo curl=$?`)
		if strings.Contains(out, "curl=0") {
			t.Errorf("the placeholder in a body went: %s", out)
		}
		// The bound host, in another header.
		out = run(0, "--session", "s", "-c", `curl -sS --max-time 20 -H "X-Debug: $GH_TOKEN" https://api.test/hdr; echo curl=$?`)
		if strings.Contains(out, "curl=0") {
			t.Errorf("the placeholder in X-Debug went: %s", out)
		}
		if reqs := got.since(n); len(reqs) != 0 {
			t.Errorf("the servers got %q", reqs)
		}
		// TLS to a host the secret is not bound to is not intercepted:
		// the guest's own TLS reaches the server, its certificate (of a
		// CA the guest does not know) unreplaced by the session CA's.
		out = run(0, "--session", "s", "-c", `curl -sS --max-time 20 https://other.test/x; echo curl=$?`)
		if !strings.Contains(out, "curl=60") {
			t.Errorf("curl to other.test should fail to verify the test CA's certificate: %s", out)
		}
	})
	t.Run("a host whose certificate does not verify", func(t *testing.T) {
		n := got.count()
		out := run(0, "--session", "s", "-c", curl("https://bad.test/x")+"; echo curl=$?")
		if strings.Contains(out, "curl=0") {
			t.Errorf("bad.test: %s", out)
		}
		if reqs := got.since(n); len(reqs) != 0 {
			t.Errorf("bad.test got %q", reqs)
		}
	})
	t.Run("a secret outside the profile", func(t *testing.T) {
		out := run(201, "--secret", "NPM_TOKEN", "true")
		if !strings.Contains(out, `secret "NPM_TOKEN" is not one of the profile's secrets (GH_TOKEN)`) || !strings.Contains(out, "secrets") {
			t.Errorf("refusal: %s", out)
		}
	})
	t.Run("a one-shot VM", func(t *testing.T) {
		n := got.count()
		out := run(0, "--secret", "GH_TOKEN", "-c", `echo "var=$GH_TOKEN"; `+curl("https://api.test/oneshot"))
		if strings.Contains(out, "var="+placeholder) || !strings.Contains(out, "var=vmgate_secret_") {
			t.Errorf("a fresh VM's placeholder should be its own: %s", out)
		}
		sentOnce(n, `api.test /oneshot auth="Bearer `+value+`"`)
	})

	t.Run("two commands ask at once", func(t *testing.T) {
		run(0, "--session", "c", "true")
		outs := make([]string, 2)
		var wg sync.WaitGroup
		for i := range outs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				so, se, code := vmExec(t, d.Socket, "", "--session", "c", "--secret", "GH_TOKEN", "-c", `echo "$GH_TOKEN"`)
				if code != 0 {
					t.Errorf("exit %d: %s %s", code, so, se)
				}
				outs[i] = so
			}()
		}
		wg.Wait()
		if outs[0] != outs[1] || !strings.HasPrefix(outs[0], "vmgate_secret_") {
			t.Fatalf("one session, two placeholders: %q", outs)
		}
		n := got.count()
		run(0, "--session", "c", "-c", curl("https://api.test/both"))
		sentOnce(n, `api.test /both auth="Bearer `+value+`"`)
	})

	ctx := context.Background()
	t.Run("fork, pause and resume", func(t *testing.T) {
		if _, err := d.Client.ForkSession(ctx, "s", []string{"s2"}); err != nil {
			t.Fatal(err)
		}
		n := got.count()
		run(0, "--session", "s2", "-c", `test "$GH_TOKEN" = "$(cat /root/placeholder)" && `+curl("https://api.test/fork"))
		sentOnce(n, `api.test /fork auth="Bearer `+value+`"`)
		if _, err := d.Client.PauseSession(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		// The save point holds the placeholder (the guest wrote it to
		// its disk), never the value.
		holds := func(needle string) bool { return treeHolds(t, filepath.Join(state, "sessions"), needle) }
		if !holds(placeholder) {
			t.Errorf("the paused session's files do not hold the placeholder: the search finds nothing")
		}
		if holds(value) {
			t.Errorf("the paused session's files hold the value")
		}
		n = got.count()
		run(0, "--session", "s", "-c", curl("https://api.test/resumed"))
		sentOnce(n, `api.test /resumed auth="Bearer `+value+`"`)
	})
	t.Run("a reload changes the value", func(t *testing.T) {
		if err := os.WriteFile(secretFile, []byte(value2), 0o600); err != nil {
			t.Fatal(err)
		}
		d.Reload()
		n := got.count()
		run(0, "--session", "s", "-c", curl("https://api.test/rotated"))
		sentOnce(n, `api.test /rotated auth="Bearer `+value2+`"`)
		// A world-readable file refuses the reload: the value stays.
		if err := os.Chmod(secretFile, 0o644); err != nil {
			t.Fatal(err)
		}
		d.Reload()
		st, err := d.Client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(st.PolicyError, "mode 0644 lets others read it") {
			t.Errorf("status after a reload with a world-readable secret: %q", st.PolicyError)
		}
		n = got.count()
		run(0, "--session", "s2", "-c", curl("https://api.test/kept"))
		sentOnce(n, `api.test /kept auth="Bearer `+value2+`"`)
	})

	// The audit log: names and places, never a value.
	if b, err := os.ReadFile(d.AuditPath); err != nil || bytes.Contains(b, []byte(value)) || bytes.Contains(b, []byte(value2)) {
		t.Fatalf("the audit log holds the value (or cannot be read: %v)", err)
	}
	var refusals []string
	for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
		if r.Kind == audit.KindNet && r.Net != nil && r.Net.Secret != "" {
			refusals = append(refusals, fmt.Sprintf("%s:%d %s %s", r.Net.Name, r.Net.Port, r.Net.Secret, r.Net.SecretPlace))
			if r.Verdict != audit.VerdictDeny {
				t.Errorf("a refusal audited as %s", r.Verdict)
			}
		}
	}
	for _, want := range []string{"other.test:80 GH_TOKEN header Authorization", "api.test:443 GH_TOKEN body", "api.test:443 GH_TOKEN header X-Debug"} {
		if !strings.Contains(strings.Join(refusals, "\n"), want) {
			t.Errorf("no refusal %q audited; refusals: %q", want, refusals)
		}
	}
	logMu.Lock()
	logged := daemonLog.String()
	logMu.Unlock()
	if strings.Contains(logged, value) || strings.Contains(logged, value2) {
		t.Errorf("the daemon's log holds the value")
	}
}

// treeHolds reports whether a file under dir holds needle.
func treeHolds(t *testing.T, dir, needle string) bool {
	t.Helper()
	found := false
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || found || !e.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		found = bytes.Contains(b, []byte(needle))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
