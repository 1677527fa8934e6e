package vm

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/guest/agentconn"
	"github.com/vmgate/vmgate/vm/guest/agentproto"
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
