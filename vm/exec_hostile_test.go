package vm

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/internal/testutil"
)

// hostileAgent is what a fake guest agent does once its SSH connection is
// up; it gets its connection and channels.
type hostileAgent func(conn *stallConn, chans <-chan ssh.NewChannel)

// stallConn is the agent's end of the connection; after stall, it reads
// nothing more (until the connection is gone), as an agent that stopped
// reading its port.
type stallConn struct {
	net.Conn
	stalled chan struct{}
	gone    chan struct{}
}

func (c *stallConn) stall() { close(c.stalled) }

func (c *stallConn) Read(p []byte) (int, error) {
	select {
	case <-c.stalled:
		<-c.gone
		return 0, net.ErrClosed
	default:
	}
	return c.Conn.Read(p)
}

// fakeVM is a VM whose "QEMU" is a sleeping process and whose agent is
// hostile. As with a real QEMU, the agent's end of the connection goes
// away when that process dies. An agent that stops reading makes the
// host's writes block once the socket's buffer is full.
func fakeVM(t *testing.T, agent hostileAgent) *VM {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	hostEnd, pipeEnd := testutil.SocketPair(t)
	guestEnd := &stallConn{Conn: pipeEnd, stalled: make(chan struct{}), gone: make(chan struct{})}
	qemu := exec.Command("sleep", "600")
	if err := qemu.Start(); err != nil {
		t.Skipf("no sleep(1): %v", err)
	}
	v := &VM{ID: "fake", Dir: t.TempDir(), log: slog.New(slog.NewTextHandler(io.Discard, nil)), cmd: qemu, exited: make(chan struct{})}
	go func() {
		v.exitErr = qemu.Wait()
		close(v.exited)
		close(guestEnd.gone)
		guestEnd.Close()
		hostEnd.Close()
	}()
	t.Cleanup(func() { _ = qemu.Process.Kill(); <-v.exited })
	go func() {
		cfg := &ssh.ServerConfig{NoClientAuth: true}
		cfg.AddHostKey(signer)
		sc, chans, reqs, err := ssh.NewServerConn(guestEnd, cfg)
		if err != nil {
			return
		}
		defer sc.Close()
		go ssh.DiscardRequests(reqs)
		agent(guestEnd, chans)
	}()
	c, chans, reqs, err := ssh.NewClientConn(hostEnd, "fake", &ssh.ClientConfig{User: "vmgate", HostKeyCallback: ssh.FixedHostKey(signer.PublicKey())})
	if err != nil {
		t.Fatal(err)
	}
	v.client = ssh.NewClient(c, chans, reqs)
	return v
}

// TestExecHostileAgent: whatever the agent does, a command with a time
// limit ends within limit + kill grace + a margin, and the VM is killed.
func TestExecHostileAgent(t *testing.T) {
	const limit, grace = time.Second, time.Second
	for name, agent := range map[string]hostileAgent{
		"never confirms the channel": func(_ *stallConn, chans <-chan ssh.NewChannel) {
			for range chans { // neither accepted nor rejected
			}
		},
		"never answers exec": func(_ *stallConn, chans <-chan ssh.NewChannel) {
			for nc := range chans {
				ch, reqs, err := nc.Accept()
				if err != nil {
					return
				}
				defer ch.Close()
				go func() {
					for range reqs { // never replied
					}
				}()
			}
		},
		"stops reading its port": func(conn *stallConn, chans <-chan ssh.NewChannel) {
			nc, ok := <-chans
			if !ok {
				return
			}
			ch, reqs, err := nc.Accept()
			if err != nil {
				return
			}
			defer ch.Close()
			r := <-reqs
			conn.stall() // before the reply: nothing after it is read
			_ = r.Reply(true, nil)
			<-conn.gone
		},
	} {
		t.Run(name, func(t *testing.T) {
			v := fakeVM(t, agent)
			stdin := strings.NewReader(strings.Repeat("x", 8<<20)) // more than any window
			t0 := time.Now()
			res, err := v.Exec(context.Background(), ExecRequest{Argv: []string{"cat"}, Stdin: stdin, Timeout: limit, KillGrace: grace})
			took := time.Since(t0)
			if !errors.Is(err, ErrAgentUnresponsive) {
				t.Errorf("Exec returned %+v, %v; want ErrAgentUnresponsive", res, err)
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
