package agent

import (
	"context"
	"encoding"
	"errors"
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

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

// testTimeout bounds every wait in the tests.
const testTimeout = 30 * time.Second

// testLogger logs to the test's output.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// agent is an agent serving one connection to a test.
type agent struct {
	conn   net.Conn // the host's end
	done   chan error
	cancel context.CancelFunc
}

// startAgent runs Serve on one end of a socket pair. edit, if not nil,
// adjusts the configuration. At the end of the test the host's end is
// closed and Serve must return.
func startAgent(t *testing.T, edit func(*Config)) *agent {
	t.Helper()
	a := &agent{done: make(chan error, 1)}
	cfg := Config{
		Logger:  testLogger(t),
		Version: "test-version",
		setClock: func(time.Time) error {
			return errors.New("the tests never set the clock")
		},
	}
	if edit != nil {
		edit(&cfg)
	}
	serverEnd, hostEnd := testutil.SocketPair(t)
	a.conn = hostEnd
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	go func() { a.done <- Serve(ctx, serverEnd, cfg) }()
	t.Cleanup(func() {
		a.conn.Close()
		select {
		case <-a.done:
		case <-time.After(testTimeout):
			t.Error("Serve did not return after the host closed the connection")
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

// dial connects as the host does (package agentconn) and waits for the
// agent's hello.
func (a *agent) dial(t *testing.T) *agentconn.Conn {
	t.Helper()
	c := agentconn.Client(a.conn, testLogger(t))
	t.Cleanup(func() { c.Close() })
	r, err := c.Hello(t.Context())
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	if r.AgentVersion != "test-version" {
		t.Fatalf("hello %+v", r)
	}
	return c
}

// client starts an agent and returns a connected host.
func client(t *testing.T) *agentconn.Conn {
	t.Helper()
	return startAgent(t, nil).dial(t)
}

// rawHost is the host's end driven frame by frame, for what the host's
// own code never sends and for the order of what the agent sends.
type rawHost struct {
	t   *testing.T
	a   *agent
	buf []byte
}

// raw returns the agent's raw host end, after sending hello (nil: none).
func (a *agent) raw(t *testing.T, hello *agentproto.Hello) *rawHost {
	h := &rawHost{t: t, a: a}
	if hello != nil {
		h.send(agentproto.FrameHello, 0, encode(hello))
	}
	return h
}

// read returns the agent's next frame.
func (h *rawHost) read() agentproto.Frame {
	h.t.Helper()
	_ = h.a.conn.SetReadDeadline(time.Now().Add(testTimeout))
	f, err := agentproto.ReadFrame(h.a.conn, &h.buf, agentproto.MaxGuestPayload)
	if err != nil {
		h.t.Fatal(err)
	}
	return f
}

func (h *rawHost) send(ft agentproto.FrameType, id uint32, p []byte) {
	h.t.Helper()
	if _, err := h.a.conn.Write(agentproto.AppendFrame(nil, ft, id, p)); err != nil {
		h.t.Fatal(err)
	}
}

// connect sends the hello of this protocol and reads the agent's answer.
func (a *agent) connect(t *testing.T) *rawHost {
	t.Helper()
	h := a.raw(t, &agentproto.Hello{Protocol: agentproto.Protocol})
	if f := h.read(); f.Type != agentproto.FrameHello {
		t.Fatalf("answer to the hello: %v", f.Type)
	}
	return h
}

// wire is a call's argument as it is on the wire, well-formed or not.
type wire []byte

func (w wire) MarshalBinary() ([]byte, error) { return w, nil }

// encode is m's wire form.
func encode(m encoding.BinaryMarshaler) wire {
	b, err := m.MarshalBinary()
	if err != nil {
		panic(err)
	}
	return b
}

// remote is a command started on a channel, the way the host runs
// commands.
type remote struct {
	ch             *agentconn.Channel
	stdout, stderr testutil.SyncBuffer
	done           chan struct{} // closed when both outputs reached EOF
}

// open opens a channel for o, or returns the agent's refusal.
func open(t *testing.T, c *agentconn.Conn, o agentproto.Open) (*remote, error) {
	t.Helper()
	ch, err := c.Open(t.Context(), o)
	if err != nil {
		return nil, err
	}
	r := &remote{ch: ch, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(&r.stdout, ch) })
	wg.Go(func() { _, _ = io.Copy(&r.stderr, ch.Stderr()) })
	go func() {
		wg.Wait()
		close(r.done)
	}()
	t.Cleanup(func() { ch.Close() })
	return r, nil
}

// start starts spec; the agent must accept it.
func start(t *testing.T, c *agentconn.Conn, spec agentproto.ExecSpec) *remote {
	t.Helper()
	r, err := open(t, c, agentproto.Open{Spec: spec})
	if err != nil {
		t.Fatalf("exec %v: %v", spec.Argv, err)
	}
	return r
}

// refusal opens o and returns the agent's reason to refuse it.
func refusal(t *testing.T, c *agentconn.Conn, o agentproto.Open) string {
	t.Helper()
	_, err := open(t, c, o)
	var re *agentconn.RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("open %+v: %v, want a refusal", o, err)
	}
	return re.Reason
}

// exit waits for the command's exit record and its output.
func (r *remote) exit(t *testing.T) agentproto.Exit {
	t.Helper()
	select {
	case <-r.ch.Exited():
	case <-time.After(testTimeout):
		t.Fatal("timed out waiting for the command to end")
	}
	e, ok := r.ch.ExitStatus()
	if !ok {
		t.Fatal("channel closed without an exit record")
	}
	select {
	case <-r.done:
	case <-time.After(testTimeout):
		t.Fatal("output still open after the exit record")
	}
	return e
}

// wait waits until the command ended and returns its exit status, or -1
// if it was killed by a signal.
func (r *remote) wait(t *testing.T) int {
	t.Helper()
	if e := r.exit(t); e.Signal == "" {
		return int(e.Status)
	}
	return -1
}

// result is how a command ended and what it wrote.
type result struct {
	status         int
	signal         string
	stdout, stderr string
}

// run runs spec with stdin on a new channel and waits for it to end.
func run(t *testing.T, c *agentconn.Conn, spec agentproto.ExecSpec, stdin []byte) result {
	t.Helper()
	r := start(t, c, spec)
	if len(stdin) > 0 {
		// A command may end without reading its input; then the agent
		// closes the channel and the write fails with EOF.
		if _, err := r.ch.Write(stdin); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("write stdin: %v", err)
		}
	}
	_ = r.ch.CloseWrite()
	e := r.exit(t)
	res := result{status: int(e.Status), signal: e.Signal, stdout: r.stdout.String(), stderr: r.stderr.String()}
	if e.Signal != "" {
		res.status = -1
	}
	return res
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
