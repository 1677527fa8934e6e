package vm

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

// fakeGuest is the guest's end of a fake VM's agent connection, driven
// frame by frame by a hostile agent. After stall it reads nothing more
// (until the connection is gone), as an agent that stopped reading its
// port.
type fakeGuest struct {
	conn    net.Conn
	stalled chan struct{}
	gone    chan struct{}
	buf     []byte
}

func (g *fakeGuest) stall() { close(g.stalled) }

// read returns the host's next frame, or false once the guest stalled or
// the connection is gone.
func (g *fakeGuest) read() (agentproto.Frame, bool) {
	select {
	case <-g.stalled:
		<-g.gone
		return agentproto.Frame{}, false
	default:
	}
	f, err := agentproto.ReadFrame(g.conn, &g.buf, agentproto.MaxHostPayload)
	return f, err == nil
}

func (g *fakeGuest) send(t agentproto.FrameType, id uint32, p []byte) {
	_, _ = g.conn.Write(agentproto.AppendFrame(nil, t, id, p))
}

// drain reads the host's frames until the connection ends.
func (g *fakeGuest) drain() {
	for {
		if _, ok := g.read(); !ok {
			return
		}
	}
}

// hostileAgent is what a fake guest agent does once it answered the
// host's hello.
type hostileAgent func(g *fakeGuest)

// fakeVM is a VM whose "QEMU" is a sleeping process and whose agent is
// hostile. As with a real QEMU, the agent's end of the connection goes
// away when that process dies. An agent that stops reading makes the
// host's writes block once the socket's buffer is full.
func fakeVM(t *testing.T, agent hostileAgent) *VM {
	t.Helper()
	hostEnd, guestEnd := testutil.SocketPair(t)
	// As small as the kernel allows (a few KiB), smaller than one data
	// frame: a frame write that the guest does not read stays inside
	// Write, as on a port whose ring the guest does not drain.
	if err := hostEnd.(*net.UnixConn).SetWriteBuffer(1); err != nil {
		t.Fatal(err)
	}
	g := &fakeGuest{conn: guestEnd, stalled: make(chan struct{}), gone: make(chan struct{})}
	qemu := exec.Command("sleep", "600")
	if err := qemu.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	v := &VM{ID: "fake", Dir: t.TempDir(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), cmd: qemu, exited: make(chan struct{})}
	go func() {
		v.exitErr = qemu.Wait()
		close(v.exited)
		close(g.gone)
		guestEnd.Close()
		hostEnd.Close()
	}()
	t.Cleanup(func() { _ = qemu.Process.Kill(); <-v.exited })
	go func() {
		if f, ok := g.read(); !ok || f.Type != agentproto.FrameHello {
			return
		}
		b, _ := agentproto.HelloReply{Protocol: agentproto.Protocol, AgentVersion: "hostile"}.MarshalBinary()
		g.send(agentproto.FrameHello, 0, b)
		agent(g)
	}()
	c := agentconn.Client(hostEnd, v.log)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Hello(ctx); err != nil {
		t.Fatal(err)
	}
	v.attach(c)
	return v
}

// openOf waits for the host's open and returns its channel id.
func openOf(g *fakeGuest) (uint32, bool) {
	for {
		f, ok := g.read()
		if !ok {
			return 0, false
		}
		if f.Type == agentproto.FrameOpen {
			return f.ID, true
		}
	}
}

// TestExecHostileAgent: whatever the agent does, a command with a time
// limit ends within limit + kill grace + a margin, and the VM is killed.
func TestExecHostileAgent(t *testing.T) {
	const limit, grace = time.Second, time.Second
	for name, tc := range map[string]struct {
		agent hostileAgent
		want  error
	}{
		"never answers the open": {func(g *fakeGuest) { g.drain() }, ErrAgentUnresponsive},
		"accepts, then never reports an exit": {func(g *fakeGuest) {
			if id, ok := openOf(g); ok {
				g.send(agentproto.FrameOpenOK, id, nil)
				g.drain()
			}
		}, ErrAgentUnresponsive},
		"stops reading its port": {func(g *fakeGuest) {
			if id, ok := openOf(g); ok {
				g.stall() // before the answer: nothing after it is read
				g.send(agentproto.FrameOpenOK, id, nil)
				<-g.gone
			}
		}, ErrAgentUnresponsive},
		"sends past its window": {func(g *fakeGuest) {
			if id, ok := openOf(g); ok {
				g.send(agentproto.FrameOpenOK, id, nil)
				chunk := make([]byte, agentproto.MaxData)
				for sent := 0; sent <= agentproto.Window; sent += len(chunk) {
					g.send(agentproto.FrameData, id, chunk)
				}
				g.drain()
			}
		}, ErrAgentLost},
		"breaks the protocol": {func(g *fakeGuest) {
			if id, ok := openOf(g); ok {
				g.send(agentproto.FrameSignal, id, []byte("KILL"))
				g.drain()
			}
		}, ErrAgentLost},
		"hangs up": {func(g *fakeGuest) {
			if _, ok := openOf(g); ok {
				g.conn.Close()
			}
		}, ErrAgentLost},
	} {
		t.Run(name, func(t *testing.T) {
			v := fakeVM(t, tc.agent)
			stdin := strings.NewReader(strings.Repeat("x", 8<<20)) // more than any window
			// A consumer that takes nothing: the host grants no window
			// beyond the first.
			pr, pw := io.Pipe()
			defer pr.Close()
			t0 := time.Now()
			res, err := v.Exec(context.Background(), ExecRequest{Argv: []string{"cat"}, Stdin: stdin, Stdout: pw, Timeout: limit, KillGrace: grace})
			took := time.Since(t0)
			if !errors.Is(err, tc.want) {
				t.Errorf("Exec returned %+v, %v; want %v", res, err, tc.want)
			}
			if took > limit+grace+time.Second {
				t.Errorf("Exec took %v, limit %v + grace %v + 1 s", took, limit, grace)
			}
			select {
			case <-v.exited:
			case <-time.After(time.Second):
				t.Error("the VM was not killed")
			}
			t.Logf("%v after %v", err, took.Round(time.Millisecond))
		})
	}
}

// wedge is a guest agent that takes a command, stops reading its port
// and reports the command's exit: the host's stdin pump is then stuck in
// a write that holds the connection's write lock (security round 3,
// finding 1).
func wedge(g *fakeGuest) {
	id, ok := openOf(g)
	if !ok {
		return
	}
	g.send(agentproto.FrameOpenOK, id, nil)
	// Once a data frame's head arrives, the host's stdin pump is inside
	// that frame's write, which the socket cannot hold (fakeVM): it stays
	// there, as nothing more is read.
	if !g.dataHead(id) {
		return
	}
	g.stall()
	g.send(agentproto.FrameExit, id, agentproto.EncodeExit(agentproto.Exit{Status: 0}))
	<-g.gone
}

// dataHead reads the host's frames until the head of a data frame of
// channel id, and leaves its payload unread.
func (g *fakeGuest) dataHead(id uint32) bool {
	for {
		var h [agentproto.HeaderSize]byte
		if _, err := io.ReadFull(g.conn, h[:]); err != nil {
			return false
		}
		n := binary.BigEndian.Uint32(h[:4])
		if agentproto.FrameType(h[4]) == agentproto.FrameData && binary.BigEndian.Uint32(h[5:]) == id {
			return true
		}
		if n < 5 {
			return false
		}
		if _, err := io.CopyN(io.Discard, g.conn, int64(n-5)); err != nil {
			return false
		}
	}
}

// wedged runs a command with a large stdin on a VM whose agent is wedge,
// and returns once the command's exit arrived (the stdin pump still
// writing). writeTimeout is the host's bound on a frame write.
func wedged(t *testing.T, control, writeTimeout time.Duration) *VM {
	t.Helper()
	v := fakeVM(t, wedge)
	v.control = control
	v.agent.SetWriteTimeout(writeTimeout)
	res, err := v.Exec(context.Background(), ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader(strings.Repeat("x", 8<<20)), KillGrace: 200 * time.Millisecond})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("the wedged command: %+v %v", res, err)
	}
	return v
}

// TestWedgedAgentCall: after a wedging command, the next call (what
// --get, --put and cp ask first) ends within its own limit, or as soon as
// the request's context ends, whatever the stuck write does; the VM is
// killed.
func TestWedgedAgentCall(t *testing.T) {
	const control = 500 * time.Millisecond
	for name, tc := range map[string]struct {
		ctx     func() (context.Context, context.CancelFunc)
		control time.Duration
		within  time.Duration
		want    error
	}{
		"its own limit": {func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			control, control + time.Second, ErrAgentUnresponsive},
		"the request's context": {func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), control)
		},
			time.Hour, control + time.Second, context.DeadlineExceeded},
	} {
		t.Run(name, func(t *testing.T) {
			// The write deadline is out of reach: only the call's own
			// bounds can end it.
			v := wedged(t, tc.control, time.Hour)
			ctx, cancel := tc.ctx()
			defer cancel()
			t0 := time.Now()
			ok, err := v.CanTransfer(ctx)
			took := time.Since(t0)
			if ok || !errors.Is(err, tc.want) {
				t.Errorf("CanTransfer: %v, %v; want %v", ok, err, tc.want)
			}
			if took > tc.within {
				t.Errorf("CanTransfer took %v, want at most %v", took, tc.within)
			}
			select {
			case <-v.exited:
			case <-time.After(2 * time.Second):
				t.Error("the VM of a wedged agent was not killed")
			}
		})
	}
}

// TestWedgedAgentWriteDeadline: a frame write that a guest does not drain
// ends at the host's write deadline, with the connection and the VM.
func TestWedgedAgentWriteDeadline(t *testing.T) {
	v := wedged(t, time.Hour, 300*time.Millisecond)
	select {
	case <-v.exited:
	case <-time.After(3 * time.Second):
		t.Fatal("a write the guest never drained did not end the VM")
	}
	if err := v.died("after the write deadline"); !errors.Is(err, ErrAgentLost) {
		t.Errorf("the VM's end: %v, want ErrAgentLost", err)
	}
}

// TestWedgedAgentSignalFlood: signals sent to a command whose agent has
// stopped reading queue for one sender, and are dropped beyond its queue:
// 200,000 of them make no more than a handful of goroutines.
func TestWedgedAgentSignalFlood(t *testing.T) {
	v := fakeVM(t, func(g *fakeGuest) {
		if id, ok := openOf(g); ok {
			g.stall()
			g.send(agentproto.FrameOpenOK, id, nil)
			<-g.gone
		}
	})
	v.agent.SetWriteTimeout(time.Hour)
	signals := make(chan string)
	before := runtime.NumGoroutine()
	peak := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for range 200_000 {
			signals <- "INT"
		}
		peak <- runtime.NumGoroutine()
		cancel()
	}()
	_, err := v.Exec(ctx, ExecRequest{Argv: []string{"cat"}, Stdin: strings.NewReader(strings.Repeat("x", 8<<20)),
		Signals: signals, Timeout: time.Minute, KillGrace: 200 * time.Millisecond})
	select {
	case n := <-peak:
		if n-before > 50 {
			t.Errorf("%d goroutines after 200,000 signals (%d before)", n, before)
		}
	default:
		t.Fatalf("Exec returned (%v) before the signals were sent", err)
	}
}
