package cli

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

// publishPolicy lets every caller publish its sessions' ports on loopback
// addresses and Unix sockets; the VMs have a NIC (one egress rule nobody
// uses here).
const publishPolicy = `version = 1
[[profile]]
name = "web"
match = { any = true }
allow_shell = true
max_vms = 4
[profile.timeout]
default = "2m"
max = "10m"
[profile.network]
mode = "allowlist"
allow = ["deb.debian.org:80"]
[profile.sessions]
allowed = true
publish = true
publish_max_conns = 4
`

// noNetworkPolicy is publishPolicy before its profile had a network.
const noNetworkPolicy = `version = 1
[[profile]]
name = "web"
match = { any = true }
allow_shell = true
[profile.sessions]
allowed = true
`

// guestHTTP starts python3's http.server on port 8000 of the guest in the
// background, serving /tmp/www: the command returns once it listens (it
// binds, then forks into the background), so no one waits for it.
const guestHTTP = `mkdir -p /tmp/www && echo hello-from-the-guest > /tmp/www/index.html && cd /tmp/www && python3 - <<'EOF'
import http.server as h, os
s = h.ThreadingHTTPServer(("0.0.0.0", 8000), h.SimpleHTTPRequestHandler)
if os.fork():
    os._exit(0)
os.setsid()
fd = os.open("/dev/null", os.O_RDWR)
for i in (0, 1, 2):
    os.dup2(fd, i)
s.serve_forever()
EOF`

// forward is a running `vm-exec --session S --publish SPEC`.
type forward struct {
	cmd    *exec.Cmd
	addr   string // what it printed: where it listens
	stderr *strings.Builder
	exited chan error
}

// startPublish runs vm-exec --publish and returns once it forwards (its
// first line on stdout is the address).
func startPublish(t *testing.T, socket, session, spec string) *forward {
	t.Helper()
	f := &forward{cmd: exec.Command(binary(t, "vm-exec"), "--session", session, "--publish", spec), stderr: &strings.Builder{}, exited: make(chan error, 1)}
	f.cmd.Env = append(os.Environ(), "VMGATE_SOCKET="+socket)
	f.cmd.Stderr = f.stderr
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.cmd.Process.Kill() })
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(out).ReadString('\n')
		line <- strings.TrimSpace(l)
		_, _ = io.Copy(io.Discard, out)
		f.exited <- f.cmd.Wait()
	}()
	select {
	case f.addr = <-line:
	case <-time.After(2 * time.Minute):
		t.Fatalf("vm-exec --publish %s printed no address; stderr: %s", spec, f.stderr)
	}
	if f.addr == "" {
		t.Fatalf("vm-exec --publish %s: %v; stderr: %s", spec, <-f.exited, f.stderr)
	}
	return f
}

// wait waits for the forward's vm-exec to exit, and returns its stderr.
func (f *forward) wait(t *testing.T) string {
	t.Helper()
	select {
	case err := <-f.exited:
		if err != nil {
			t.Errorf("vm-exec --publish %s: %v; stderr: %s", f.addr, err, f.stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("vm-exec --publish %s did not end; stderr: %s", f.addr, f.stderr)
	}
	return f.stderr.String()
}

// curl fetches url with the host's curl (args first), and returns its
// output, stderr and exit code.
func curl(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	return runCmd(t, nil, "curl", append([]string{"-sS", "--max-time", "30"}, args...)...)
}

// refusedAtOnce reports whether curl's exit code says the server reset
// or closed the connection: 56 (reset while receiving), 52 (closed
// without an answer) or 7 (reset so soon that curl's connect saw it);
// not 28, a time-out.
func refusedAtOnce(code int) bool { return code == 56 || code == 52 || code == 7 }

// TestServe_Publish: a session's web server on the host through the real
// daemon and a real VM. curl gets the guest's page on a loopback port and
// on a Unix socket; a port nothing listens on in the guest is reset at
// once; a paused session's port refuses and comes back with its resume;
// a busy host port, a non-loopback address without the relaxation and a
// malformed spec are clear errors; every connection is an audit record;
// the end of the session closes the ports and removes the socket file.
func TestServe_Publish(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("needs curl")
	}
	dir := t.TempDir()
	// A session begun while its profile had no network has no NIC, and
	// keeps none when the policy gains one: it cannot publish.
	s := startServeWith(t, dir, noNetworkPolicy)
	if _, se, code := vmExec(t, s.socket, "--session", "plain", "true"); code != 0 {
		t.Fatalf("a session without a NIC: %d %q", code, se)
	}
	reload(t, s, publishPolicy)
	if _, se, code := vmExec(t, s.socket, "--session", "plain", "--publish", "127.0.0.1:0:8000"); code != wire.ExitDenied || !strings.Contains(se, `session "plain" has no network`) {
		t.Errorf("publish a session without a NIC: %d %q", code, se)
	}
	if _, se, code := vmExec(t, s.socket, "--end-session", "plain"); code != 0 {
		t.Fatalf("end session: %d %q", code, se)
	}

	if so, se, code := vmExec(t, s.socket, "--session", "web", "-c", guestHTTP); code != 0 {
		t.Fatalf("start the guest's server: %d %q %q", code, so, se)
	}

	tcp := startPublish(t, s.socket, "web", "127.0.0.1:0:8000")
	page, se, code := curl(t, "http://"+tcp.addr+"/index.html")
	if code != 0 || page != "hello-from-the-guest\n" {
		t.Fatalf("curl through %s: %d %q %q", tcp.addr, code, page, se)
	}
	sock := filepath.Join(dir, "app.sock")
	unixFwd := startPublish(t, s.socket, "web", sock+":8000")
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the published socket: %v %v (want mode 0600)", fi, err)
	}
	if page, se, code := curl(t, "--unix-socket", sock, "http://guest/index.html"); code != 0 || page != "hello-from-the-guest\n" {
		t.Errorf("curl through %s: %d %q %q", sock, code, page, se)
	}
	so, _, _ := vmExec(t, s.socket, "--list-sessions", "--json")
	var listed []wire.Session
	if err := json.Unmarshal([]byte(so), &listed); err != nil || len(listed) != 1 ||
		!slices.Equal(listed[0].Published, []string{tcp.addr + "->8000", sock + "->8000"}) {
		t.Errorf("the session's published ports are not listed: %s %v", so, err)
	}

	t.Run("guest port not listening", func(t *testing.T) {
		closed := startPublish(t, s.socket, "web", "127.0.0.1:0:8001")
		t0 := time.Now()
		_, se, code := curl(t, "http://"+closed.addr+"/")
		if !refusedAtOnce(code) {
			t.Errorf("curl of a port nothing listens on: exit %d %q, want a reset (56)", code, se)
		}
		t.Logf("refused after %v: %s", time.Since(t0), strings.TrimSpace(se))
		if err := closed.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if got := closed.wait(t); !strings.Contains(got, "no longer published (stopped)") {
			t.Errorf("stopped forward says %q", got)
		}
		if _, err := net.Dial("tcp", closed.addr); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("the stopped forward's port: %v, want connection refused", err)
		}
	})
	t.Run("connection bound", func(t *testing.T) {
		// publish_max_conns = 4: four connections held open (the guest's
		// server waits for their requests), the fifth is reset at once,
		// and the first still works.
		var held []net.Conn
		for range 4 {
			c, err := net.Dial("tcp", tcp.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			held = append(held, c)
		}
		// The reset can come before the dial returns: Go's dial reads
		// the socket's error once the handshake is done, and on loopback
		// the forward's reset may already be there.
		fifth, err := net.Dial("tcp", tcp.addr)
		if err == nil {
			defer fifth.Close()
			_ = fifth.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, err = fifth.Read(make([]byte, 1))
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the fifth connection: %v, want a reset", err)
		}
		_ = held[0].SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.WriteString(held[0], "GET /index.html HTTP/1.0\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if b, err := io.ReadAll(held[0]); err != nil || !strings.HasSuffix(string(b), "\r\n\r\nhello-from-the-guest\n") {
			t.Errorf("the first connection: %q %v", b, err)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		busy, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer busy.Close()
		for _, c := range []struct {
			spec string
			code int
			want []string
		}{
			{busy.Addr().String() + ":8000", 200, []string{busy.Addr().String(), "in use"}},
			{"0.0.0.0:0:8000", 201, []string{"publish_any_address", "not loopback"}},
			{"127.0.0.1:8080", 207, []string{"--publish", "without a host port"}},
			{"example.com:8080:8000", 207, []string{"--publish", "not an IP address"}},
			{"127.0.0.1:0:0", 207, []string{"--publish", "guest port"}},
		} {
			_, se, code := vmExec(t, s.socket, "--session", "web", "--publish", c.spec)
			if code != c.code {
				t.Errorf("--publish %s: exit %d, want %d (%q)", c.spec, code, c.code, se)
			}
			for _, w := range c.want {
				if !strings.Contains(se, w) {
					t.Errorf("--publish %s: %q lacks %q", c.spec, se, w)
				}
			}
		}
		_, se, code := vmExec(t, s.socket, "--session", "nosuch", "--publish", "127.0.0.1:0:8000")
		if code != 200 || !strings.Contains(se, `no session "nosuch"`) {
			t.Errorf("publish a session that is none: %d %q", code, se)
		}
	})
	t.Run("pause and resume", func(t *testing.T) {
		if _, se, code := vmExec(t, s.socket, "--session", "web", "--pause"); code != 0 {
			t.Fatalf("pause: %d %q", code, se)
		}
		if _, se, code := curl(t, "http://"+tcp.addr+"/index.html"); !refusedAtOnce(code) {
			t.Errorf("curl of a paused session's port: exit %d %q, want a reset", code, se)
		}
		if _, se, code := vmExec(t, s.socket, "--session", "web", "true"); code != 0 {
			t.Fatalf("resume: %d %q", code, se)
		}
		if page, se, code := curl(t, "http://"+tcp.addr+"/index.html"); code != 0 || page != "hello-from-the-guest\n" {
			t.Errorf("curl after the resume: %d %q %q", code, page, se)
		}
	})

	if _, se, code := vmExec(t, s.socket, "--end-session", "web"); code != 0 {
		t.Fatalf("end session: %d %q", code, se)
	}
	for _, f := range []*forward{tcp, unixFwd} {
		if got := f.wait(t); !strings.Contains(got, "the session ended") {
			t.Errorf("forward %s ended with %q", f.addr, got)
		}
	}
	if _, err := net.Dial("tcp", tcp.addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after the session's end %s: %v, want connection refused", tcp.addr, err)
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after the session's end the socket file: %v", err)
	}
	checkForwardAudit(t, s.audit, tcp.addr, sock)
}

// reload writes policy and has the daemon read it again (SIGHUP).
func reload(t *testing.T, s *served, policy string) {
	t.Helper()
	if err := os.WriteFile(s.policy, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-s.reload:
		if !strings.Contains(line, "policy reloaded") {
			t.Fatalf("reload: %s", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no reload after SIGHUP")
	}
}

// checkForwardAudit reads the audit log: the forwarded connections of
// the TCP and Unix socket ports with their bytes, the refused ones with
// their reasons, the denied publish, and the ports' start and end.
func checkForwardAudit(t *testing.T, path, tcpAddr, sock string) {
	t.Helper()
	recs := testutil.JSONLines[audit.Record](t, path)
	find := func(what string, f func(audit.Record) bool) audit.Record {
		t.Helper()
		for _, r := range recs {
			if f(r) {
				return r
			}
		}
		t.Errorf("no audit record of %s", what)
		return audit.Record{}
	}
	fwd := func(addr string, v audit.Verdict, reason string) func(audit.Record) bool {
		return func(r audit.Record) bool {
			return r.Kind == audit.KindNet && r.Net != nil && r.Net.Proto == "forward" && r.Net.Addr == addr && r.Verdict == v && strings.Contains(r.Reason, reason)
		}
	}
	for _, addr := range []string{tcpAddr, sock} {
		r := find("a connection through "+addr, fwd(addr, audit.VerdictAllow, ""))
		if r.Session != "web" || r.Net.Port != 8000 || r.Net.BytesIn == 0 || r.Net.BytesOut == 0 || r.UID == nil || r.VMID == "" || r.Net.Peer == "" {
			t.Errorf("the record of a connection through %s: %+v %+v", addr, r, r.Net)
		}
	}
	find("the paused session's refusal", fwd(tcpAddr, audit.VerdictDeny, "paused"))
	find("the refusal past publish_max_conns", fwd(tcpAddr, audit.VerdictDeny, "carries 4 connections already"))
	find("a refusal by the guest", func(r audit.Record) bool {
		return r.Kind == audit.KindNet && r.Net != nil && r.Net.Proto == "forward" && r.Net.Port == 8001 && strings.Contains(r.Reason, "refused")
	})
	find("the denied publish on 0.0.0.0", func(r audit.Record) bool {
		return r.Kind == audit.KindDecision && r.Verdict == audit.VerdictDeny && r.Rule == "sessions.publish_any_address"
	})
	find("the port's end with the session", func(r audit.Record) bool {
		return r.Kind == audit.KindSession && strings.HasPrefix(r.Message, "unpublished "+tcpAddr) && strings.Contains(r.Message, "the session ended")
	})
}
