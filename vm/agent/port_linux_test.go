package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/vm/agentproto"
)

// The virtio-serial port reports POLLHUP while no host is connected to the
// QEMU side and fails reads at once. A pty master behaves the same way while
// its slave is closed, and recovers when the slave is opened again, so the
// tests use the master as the "device" and the slave as the host's socket.

// fakeDevice returns a pty master in raw mode with its slave closed, and the
// slave's path.
func fakeDevice(t *testing.T) (*os.File, string) {
	t.Helper()
	master, slave, err := openPty()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	name := slave.Name()
	// Termios requests on the master apply to the slave.
	rc, err := master.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var terr error
	if err := rc.Control(func(fd uintptr) {
		var tio *unix.Termios
		if tio, terr = unix.IoctlGetTermios(int(fd), unix.TCGETS); terr != nil {
			return
		}
		tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
		tio.Oflag &^= unix.OPOST
		tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		tio.Cflag &^= unix.CSIZE | unix.PARENB
		tio.Cflag |= unix.CS8
		tio.Cc[unix.VMIN], tio.Cc[unix.VTIME] = 1, 0
		terr = unix.IoctlSetTermios(int(fd), unix.TCSETS, tio)
	}); err != nil {
		t.Fatal(err)
	}
	if terr != nil {
		t.Fatalf("set raw mode: %v", terr)
	}
	slave.Close()
	t.Cleanup(func() { master.Close() })
	return master, name
}

// hostEnd opens the slave side as the host's connection.
type hostEnd struct {
	*os.File
}

func (h hostEnd) LocalAddr() net.Addr  { return portAddr("test-host") }
func (h hostEnd) RemoteAddr() net.Addr { return portAddr("test-agent") }

func connectHost(t *testing.T, slave string) hostEnd {
	t.Helper()
	f, err := os.OpenFile(slave, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("open %s: %v", slave, err)
	}
	return hostEnd{f}
}

func TestPollHangupFollowsPeer(t *testing.T) {
	master, slave := fakeDevice(t)
	if hup, err := pollHangup(master); err != nil || !hup {
		t.Fatalf("no host: hangup=%v err=%v, want true", hup, err)
	}
	h := connectHost(t, slave)
	if hup, err := pollHangup(master); err != nil || hup {
		t.Fatalf("host connected: hangup=%v err=%v, want false", hup, err)
	}
	h.Close()
	if hup, err := pollHangup(master); err != nil || !hup {
		t.Fatalf("host gone: hangup=%v err=%v, want true", hup, err)
	}
}

// TestDevicePortReconnects runs the daemon loop of Main on a fake device:
// hosts connect and disconnect in turn while the device stays open.
func TestDevicePortReconnects(t *testing.T) {
	master, slave := fakeDevice(t)
	hostKey, clientKey := newSigner(t), newSigner(t)
	cfg := Config{HostKey: hostKey, AuthorizedKeys: []ssh.PublicKey{clientKey.PublicKey()}, Logger: testLogger(t), Version: "v"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- servePort(ctx, &devicePort{f: master, interval: 5 * time.Millisecond}, cfg) }()

	// Let the agent poll the hung-up device for a while first.
	time.Sleep(50 * time.Millisecond)
	for i := range 3 {
		h := connectHost(t, slave)
		conn, chans, reqs, err := ssh.NewClientConn(h, "agent", clientConfig(agentproto.User, clientKey, hostKey.PublicKey()))
		if err != nil {
			t.Fatalf("connection %d: handshake: %v", i, err)
		}
		c := ssh.NewClient(conn, chans, reqs)
		if res := run(t, c, argv("sh", "-c", "echo hi; echo there >&2"), nil); res.stdout != "hi\n" || res.stderr != "there\n" {
			t.Errorf("connection %d: %+v", i, res)
		}
		c.Close()
		h.Close()
		// A real host does not reconnect within microseconds. If it did,
		// the agent could miss the hangup and hand the new host's bytes
		// to the old connection; the host's handshake would then fail and
		// it would have to retry.
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("servePort = %v, want context.Canceled", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("servePort did not return after cancel")
	}
	// The device is still open.
	if _, err := master.Stat(); err != nil {
		t.Errorf("device closed: %v", err)
	}
}

func TestFileConnCloseKeepsFileOpen(t *testing.T) {
	master, slave := fakeDevice(t)
	h := connectHost(t, slave)
	defer h.Close()
	c, err := newFileConn(master)
	if err != nil {
		t.Fatal(err)
	}
	readErr := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 10))
		readErr <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	select {
	case err := <-readErr:
		if err == nil {
			t.Error("pending read succeeded after close")
		}
	case <-time.After(testTimeout):
		t.Fatal("close did not interrupt a pending read")
	}
	c.release()
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("write after close = %v", err)
	}
	if err := c.SetDeadline(time.Time{}); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetDeadline after close = %v", err)
	}

	// A new connection on the same file works.
	c2, err := newFileConn(master)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := c2.Read(buf); err != nil || string(buf) != "ping" {
		t.Fatalf("read on the next connection: %q, %v", buf, err)
	}
}
