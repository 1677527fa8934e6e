package sshfront

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/policy"
)

// fakeCore is the daemon without VMs: every command "runs" by printing
// its argv and exits 0, but one starting with "deny", which is refused.
type fakeCore struct{ pol *policy.Policy }

func (c *fakeCore) Policy() *policy.Policy                       { return c.pol }
func (c *fakeCore) Audit(audit.Record) error                     { return nil }
func (c *fakeCore) ListenUnix(path string) (net.Listener, error) { return net.Listen("unix", path) }

func (c *fakeCore) Exec(_ context.Context, _ *slog.Logger, r Request) Outcome {
	if strings.HasPrefix(r.Exec.Argv[0], "deny") {
		return Outcome{RequestID: "fake", Refused: &wire.Error{Code: wire.CodeDenied, Error: "the fake core refuses it"}}
	}
	_, _ = fmt.Fprintf(r.Stdout, "ran %q\n", r.Exec.Argv)
	return Outcome{RequestID: "fake"}
}

const fakePolicy = `version = 1
[[profile]]
name = "agent"
match = { ssh = true }
allow_shell = true
`

// testFront is a front door on a fake core, with keys of its own.
type testFront struct {
	f       *Front
	network string
	addr    string
	hostPK  ssh.PublicKey
	keys    []ssh.Signer
	logs    *testutil.SyncBuffer
}

// newTestFront serves nkeys keys on a loopback TCP port, or on listen
// (a unix: address) when given.
func newTestFront(t *testing.T, nkeys int, listen string, mutate func(*Config)) *testFront {
	t.Helper()
	dir := t.TempDir()
	pol, err := policy.Parse("fake.toml", []byte(fakePolicy))
	if err != nil {
		t.Fatal(err)
	}
	tf := &testFront{logs: &testutil.SyncBuffer{}}
	var lines strings.Builder
	for range nkeys {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ssh.NewSignerFromKey(priv)
		if err != nil {
			t.Fatal(err)
		}
		tf.keys = append(tf.keys, s)
		lines.WriteString(`profile="agent" ` + string(ssh.MarshalAuthorizedKey(s.PublicKey())))
	}
	kf := filepath.Join(dir, "keys")
	if err := os.WriteFile(kf, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{AuthorizedKeys: kf, HandshakeTimeout: time.Minute}
	if listen != "" {
		cfg.Listen = []string{listen}
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cfg.Listeners = []net.Listener{ln}
	}
	if mutate != nil {
		mutate(&cfg)
	}
	log := slog.New(slog.NewTextHandler(tf.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	tf.f, err = New(&fakeCore{pol: pol}, cfg, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	tf.f.Serve()
	t.Cleanup(func() {
		tf.f.CloseListeners()
		tf.f.CloseConns()
	})
	tf.network, tf.addr = "tcp", tf.f.lns[0].ln.Addr().String()
	if listen != "" {
		tf.network = "unix"
	}
	pub, err := os.ReadFile(filepath.Join(dir, DefaultHostKey+".pub"))
	if err != nil {
		t.Fatal(err)
	}
	if tf.hostPK, _, _, _, err = ssh.ParseAuthorizedKey(pub); err != nil {
		t.Fatal(err)
	}
	return tf
}

// login connects and authenticates with key k.
func (tf *testFront) login(t *testing.T, k int) (*ssh.Client, error) {
	t.Helper()
	c, err := net.Dial(tf.network, tf.addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	cc, chans, reqs, err := ssh.NewClientConn(c, tf.addr, &ssh.ClientConfig{User: "agent",
		Auth: []ssh.AuthMethod{ssh.PublicKeys(tf.keys[k])}, HostKeyCallback: ssh.FixedHostKey(tf.hostPK)})
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	cl := ssh.NewClient(cc, chans, reqs)
	t.Cleanup(func() { cl.Close() })
	return cl, nil
}

// run runs cmd on a new session of cl and returns its output.
func run(cl *ssh.Client, cmd string) (string, error) {
	sess, err := cl.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	out, err := sess.Output(cmd)
	return string(out), err
}

// mustRun runs cmd and checks the fake core ran it.
func mustRun(t *testing.T, cl *ssh.Client, cmd string) {
	t.Helper()
	out, err := run(cl, cmd)
	if want := fmt.Sprintf("ran %q\n", []string{cmd}); err != nil || out != want {
		t.Fatalf("run %q = %q, %v; want %q", cmd, out, err, want)
	}
}

// silent opens a connection that never sends its version string, once the
// front door has answered it with its own (it is then counted).
func (tf *testFront) silent(t *testing.T) (net.Conn, error) {
	t.Helper()
	c, err := net.Dial(tf.network, tf.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return c, fmt.Errorf("no version string from the front door: %q, %w", line, err)
	}
	if line != "SSH-2.0-vmgated\r\n" {
		return c, fmt.Errorf("version line %q", line)
	}
	return c, nil
}

// closedByServer waits (at most 10 s) for the front door to close c and
// returns how long that took.
func closedByServer(c net.Conn) (time.Duration, error) {
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(10 * time.Second))
	n, err := c.Read(make([]byte, 1))
	if n != 0 || !errors.Is(err, io.EOF) && !isReset(err) {
		return 0, fmt.Errorf("read %d bytes, %v: want the connection closed", n, err)
	}
	return time.Since(start), nil
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && strings.Contains(oe.Err.Error(), "connection reset")
}

// TestPreauthFloodKeepsNoKeyOut holds every unauthenticated place with
// connections that never send a version string: a client with a key must
// still log in and run a command (its connection displaces the oldest of
// them), and a client logged in before must still be served. Before the
// pending budget, one budget held them all and the key holder was
// refused at accept.
func TestPreauthFloodKeepsNoKeyOut(t *testing.T) {
	const pending = 4
	tf := newTestFront(t, 2, "", func(c *Config) {
		// On the code before, MaxConns bounded every connection: the
		// first client and the flood fill it exactly.
		c.MaxConns, c.MaxUnauthConns, c.MaxConnsPerKey = pending+1, pending, pending
	})
	first, err := tf.login(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, first, "true")

	var flood []net.Conn
	for i := range pending {
		c, err := tf.silent(t)
		if err != nil {
			t.Fatalf("silent connection %d: %v", i, err)
		}
		flood = append(flood, c)
	}
	late, err := tf.login(t, 1)
	if err != nil {
		t.Fatalf("a key holder cannot log in while %d silent connections wait: %v", pending, err)
	}
	mustRun(t, late, "echo late")
	mustRun(t, first, "echo first")
	// The oldest silent connection made room.
	if _, err := closedByServer(flood[0]); err != nil {
		t.Fatalf("oldest silent connection: %v", err)
	}
	if n := strings.Count(tf.logs.String(), "too many SSH connections not yet authenticated"); n != 1 {
		t.Errorf("%d log lines about the pending budget, want 1:\n%s", n, tf.logs)
	}

	// A flood of twice the budget displaces only its own connections.
	for i := range 2 * pending {
		if _, err := tf.silent(t); err != nil {
			t.Fatalf("silent connection %d: %v", i, err)
		}
	}
	mustRun(t, first, "echo still")
	mustRun(t, late, "echo still")
}

// TestHandshakeDeadline: a connection is closed HandshakeTimeout after
// accept unless admitted: one that sends nothing, and one that
// authenticated over its key's limit and then waits without a session.
// The default is short (DefaultHandshakeTimeout, 20 s before).
func TestHandshakeDeadline(t *testing.T) {
	const deadline = time.Second
	tf := newTestFront(t, 1, "", func(c *Config) { c.HandshakeTimeout, c.MaxConnsPerKey = deadline, 1 })

	start := time.Now()
	c, err := tf.silent(t)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := closedByServer(c); err != nil {
		t.Fatalf("silent connection: %v", err)
	}
	if took := time.Since(start); took < deadline {
		t.Fatalf("silent connection closed after %v, before the %v deadline", took, deadline)
	}

	held, err := tf.login(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, held, "true") // admitted: its sessions are served
	over, err := tf.login(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- over.Wait() }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("a connection over its key's limit that opens no session is still open 10 s after its handshake deadline")
	}
	mustRun(t, held, "echo admitted connections have no deadline")

	var d Config
	d.setDefaults(t.TempDir())
	if d.HandshakeTimeout != DefaultHandshakeTimeout || DefaultHandshakeTimeout > 10*time.Second {
		t.Errorf("default handshake deadline %v, want %v (at most 10s)", d.HandshakeTimeout, DefaultHandshakeTimeout)
	}
}

// TestSessionsBackToBack: a client that runs commands one after the
// other on one connection never meets MaxSessions, here 1: a session's
// slot is free before the client can learn that its command ended (its
// EOF, exit status and close), so the next session, opened at once, is
// admitted. Both endings are taken, a command's and a refusal's.
func TestSessionsBackToBack(t *testing.T) {
	tf := newTestFront(t, 1, "", func(c *Config) { c.MaxSessions = 1 })
	cl, err := tf.login(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		mustRun(t, cl, fmt.Sprintf("echo %d", i))
		_, err := run(cl, "deny")
		if ee := (*ssh.ExitError)(nil); !errors.As(err, &ee) || ee.ExitStatus() != wire.ExitDenied {
			t.Fatalf("command %d, refused: %v; want exit status %d", i, err, wire.ExitDenied)
		}
	}
}

// TestPerKeyLimit: one key's connections beyond MaxConnsPerKey, and any
// beyond MaxConns, authenticate but have their sessions refused with the
// reason; another key is served meanwhile. The refusals are logged once.
func TestPerKeyLimit(t *testing.T) {
	tf := newTestFront(t, 2, "", func(c *Config) { c.MaxConns, c.MaxConnsPerKey = 3, 2 })
	fpA := ssh.FingerprintSHA256(tf.keys[0].PublicKey())
	for i := range 2 {
		cl, err := tf.login(t, 0)
		if err != nil {
			t.Fatal(err)
		}
		mustRun(t, cl, fmt.Sprintf("echo a%d", i))
	}
	for i := range 2 {
		cl, err := tf.login(t, 0)
		if err != nil {
			t.Fatalf("key A, connection %d: %v", 3+i, err)
		}
		_, err = run(cl, "echo over")
		if want := "key " + fpA + " has 2 SSH connections open, the most one key may"; err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("key A, connection %d: %v; want a refusal ~%q", 3+i, err, want)
		}
	}
	b, err := tf.login(t, 1)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, b, "echo b")
	b2, err := tf.login(t, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := run(b2, "echo over"); err == nil || !strings.Contains(err.Error(), "serves at most 3 SSH connections") {
		t.Fatalf("key B over MaxConns: %v; want a refusal", err)
	}
	logs := tf.logs.String()
	if n := strings.Count(logs, "too many SSH connections with one key"); n != 1 {
		t.Errorf("%d log lines about key A, want 1:\n%s", n, logs)
	}
	if n := strings.Count(logs, "too many authenticated SSH connections"); n != 1 {
		t.Errorf("%d log lines about MaxConns, want 1:\n%s", n, logs)
	}
}

// TestPerUIDLimitUnix: on a unix: listener a uid's connections beyond
// MaxConnsPerUID, authenticated or not, are closed at accept, before the
// front door says anything; those it holds are served. Logged once.
func TestPerUIDLimitUnix(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "ssh.sock")
	tf := newTestFront(t, 1, "unix:"+sock, func(c *Config) { c.MaxConnsPerUID, c.MaxUnauthConns = 2, 8 })
	cl, err := tf.login(t, 0)
	if err != nil {
		t.Fatal(err)
	}
	mustRun(t, cl, "true")
	if _, err := tf.silent(t); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := closedByServer(c); err != nil {
			t.Fatalf("connection %d over the uid's limit: %v", 3+i, err)
		}
	}
	mustRun(t, cl, "echo still served")
	logs := tf.logs.String()
	want := fmt.Sprintf("uid=%d max=2", os.Getuid())
	if n := strings.Count(logs, "too many SSH connections from one uid"); n != 1 || !strings.Contains(logs, want) {
		t.Errorf("%d log lines about the uid (want 1, with %s):\n%s", n, want, logs)
	}
}
