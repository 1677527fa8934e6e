package agent

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"github.com/vmgate/vmgate/internal/sshmsg"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/agentproto"
)

// testTimeout bounds every wait in the tests.
const testTimeout = 30 * time.Second

func newSigner(t testing.TB) ssh.Signer {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// testLogger logs to the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// agent is an agent serving one connection to a test.
type agent struct {
	hostKey   ssh.Signer
	clientKey ssh.Signer
	conn      net.Conn // the client's end
	done      chan error
	cancel    context.CancelFunc
}

// startAgent runs Serve on one end of a socket pair. edit, if not nil,
// adjusts the configuration. At the end of the test the client end is
// closed and Serve must return.
func startAgent(t *testing.T, edit func(*Config)) *agent {
	t.Helper()
	a := &agent{hostKey: newSigner(t), clientKey: newSigner(t), done: make(chan error, 1)}
	cfg := Config{
		HostKey:        a.hostKey,
		AuthorizedKeys: []ssh.PublicKey{a.clientKey.PublicKey()},
		Logger:         testLogger(t),
		Version:        "test-version",
		setClock: func(time.Time) error {
			return errors.New("the tests never set the clock")
		},
	}
	if edit != nil {
		edit(&cfg)
	}
	serverEnd, clientEnd := testutil.SocketPair(t)
	a.conn = clientEnd
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- Serve(ctx, serverEnd, cfg) }()
	t.Cleanup(func() {
		a.conn.Close()
		select {
		case <-a.done:
		case <-time.After(testTimeout):
			t.Error("Serve did not return after the client closed the connection")
		}
		cancel()
	})
	return a
}

// waitServe waits until Serve has returned and returns its result.
func (a *agent) waitServe(t *testing.T) error {
	t.Helper()
	select {
	case err := <-a.done:
		a.done <- err // for the next caller and the cleanup
		return err
	case <-time.After(testTimeout):
		t.Fatal("Serve did not return")
		return nil
	}
}

// clientConfig returns a client configuration for user with key, pinning
// hostKey.
func clientConfig(user string, key ssh.Signer, hostKey ssh.PublicKey) *ssh.ClientConfig {
	return &ssh.ClientConfig{
		User:            user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.FixedHostKey(hostKey),
		Timeout:         testTimeout,
	}
}

// dial performs the client handshake with the agent's expected keys.
func (a *agent) dial(t *testing.T) *ssh.Client {
	t.Helper()
	c, err := a.dialWith(clientConfig(agentproto.User, a.clientKey, a.hostKey.PublicKey()))
	if err != nil {
		t.Fatalf("dial agent: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func (a *agent) dialWith(cfg *ssh.ClientConfig) (*ssh.Client, error) {
	conn, chans, reqs, err := ssh.NewClientConn(a.conn, "vmgate-agent", cfg)
	if err != nil {
		return nil, err
	}
	return ssh.NewClient(conn, chans, reqs), nil
}

// client starts an agent and returns a connected client.
func client(t *testing.T) *ssh.Client {
	t.Helper()
	return startAgent(t, nil).dial(t)
}

// remote is a command started on a raw session channel, the way the host
// runs commands.
type remote struct {
	ch             ssh.Channel
	stdout, stderr testutil.SyncBuffer
	wg             sync.WaitGroup // output readers and request collector

	mu     sync.Mutex
	status *int
	signal *sshmsg.ExitSignalMsg
	done   chan struct{} // closed when the channel is closed and drained
}

// openSession opens a raw session channel and starts collecting its output
// and requests.
func openSession(t *testing.T, c *ssh.Client) *remote {
	t.Helper()
	ch, reqs, err := c.OpenChannel("session", nil)
	if err != nil {
		t.Fatalf("open session: %v", err)
	}
	r := &remote{ch: ch, done: make(chan struct{})}
	r.wg.Go(func() { _, _ = io.Copy(&r.stdout, ch) })
	r.wg.Go(func() { _, _ = io.Copy(&r.stderr, ch.Stderr()) })
	r.wg.Go(func() { r.collect(reqs) })
	go func() {
		r.wg.Wait()
		close(r.done)
	}()
	t.Cleanup(func() { ch.Close() })
	return r
}

func (r *remote) collect(reqs <-chan *ssh.Request) {
	for req := range reqs {
		switch req.Type {
		case "exit-status":
			var m sshmsg.ExitStatusMsg
			if ssh.Unmarshal(req.Payload, &m) == nil {
				st := int(m.Status)
				r.mu.Lock()
				r.status = &st
				r.mu.Unlock()
			}
		case "exit-signal":
			var m sshmsg.ExitSignalMsg
			if ssh.Unmarshal(req.Payload, &m) == nil {
				r.mu.Lock()
				r.signal = &m
				r.mu.Unlock()
			}
		}
		if req.WantReply {
			_ = req.Reply(false, nil)
		}
	}
}

// execSpec sends an ExecRequest and reports whether it was accepted.
func (r *remote) execSpec(t *testing.T, spec agentproto.ExecSpec) bool {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return r.execJSON(t, string(b))
}

func (r *remote) execJSON(t *testing.T, doc string) bool {
	t.Helper()
	ok, err := r.ch.SendRequest(agentproto.ExecRequest, true, ssh.Marshal(agentproto.ExecPayload{JSON: doc}))
	if err != nil {
		t.Fatalf("send exec request: %v", err)
	}
	return ok
}

// request sends a session request that wants a reply.
func (r *remote) request(t *testing.T, name string, payload any) bool {
	t.Helper()
	var b []byte
	if payload != nil {
		b = ssh.Marshal(payload)
	}
	ok, err := r.ch.SendRequest(name, true, b)
	if err != nil {
		t.Fatalf("send %s request: %v", name, err)
	}
	return ok
}

// wait waits until the agent closed the channel and returns the exit
// status, or -1 if the command was killed by a signal.
func (r *remote) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(testTimeout):
		t.Fatal("timed out waiting for the command to end")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.status != nil && r.signal != nil:
		t.Fatal("got both exit-status and exit-signal")
	case r.status != nil:
		return *r.status
	case r.signal != nil:
		return -1
	}
	t.Fatal("channel closed without exit-status or exit-signal")
	return 0
}

// result is how a command ended and what it wrote.
type result struct {
	status         int
	signal         string
	stdout, stderr string
}

// run runs spec with stdin on a new session and waits for it to end.
func run(t *testing.T, c *ssh.Client, spec agentproto.ExecSpec, stdin []byte) result {
	t.Helper()
	r := openSession(t, c)
	if !r.execSpec(t, spec) {
		t.Fatalf("exec request %v rejected: %s", spec.Argv, r.stderrAfterClose())
	}
	if len(stdin) > 0 {
		// A command may end without reading its input; then the agent
		// closes the channel and the write fails with EOF.
		if _, err := r.ch.Write(stdin); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("write stdin: %v", err)
		}
	}
	_ = r.ch.CloseWrite()
	res := result{status: r.wait(t), stdout: r.stdout.String(), stderr: r.stderr.String()}
	if r.signal != nil {
		res.signal = r.signal.Signal
	}
	return res
}

// stderrAfterClose closes the channel and returns what arrived on stderr.
func (r *remote) stderrAfterClose() string {
	r.ch.Close()
	select {
	case <-r.done:
	case <-time.After(testTimeout):
	}
	return r.stderr.String()
}

// waitPIDs waits until the command has printed n lines on stdout and
// returns them as process ids.
func waitPIDs(t *testing.T, r *remote, n int) []int {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for {
		out := r.stdout.String()
		if lines := strings.Split(out, "\n"); len(lines) > n {
			pids := make([]int, n)
			for i := range pids {
				pid, err := strconv.Atoi(strings.TrimSpace(lines[i]))
				if err != nil {
					t.Fatalf("parse pid from %q: %v", out, err)
				}
				pids[i] = pid
			}
			return pids
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d pids; stdout %q, stderr %q", n, out, r.stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitPID waits for one pid printed by the command.
func waitPID(t *testing.T, r *remote) int {
	t.Helper()
	return waitPIDs(t, r, 1)[0]
}

// processGone reports whether pid no longer exists or is a zombie awaiting
// a reaper other than the agent (orphans are reparented).
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && (s[i+2] == 'Z' || s[i+2] == 'X')
}

// waitGone waits until all pids are gone.
func waitGone(t *testing.T, pids ...int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range pids {
		for !processGone(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("process %d is still running", pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

func sleepMillis(n int) { time.Sleep(time.Duration(n) * time.Millisecond) }
