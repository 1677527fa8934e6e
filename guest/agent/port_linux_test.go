package agent

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agentconn"
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

// TestPollHangupLeavesDataAlone: the driver can make the next host's first
// bytes readable before it reports the host connected, so bytes readable
// while POLLHUP is set must stay where they are. A socket whose peer wrote
// and then closed shows exactly that: POLLIN with POLLHUP.
func TestPollHangupLeavesDataAlone(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	dev, peer := os.NewFile(uintptr(fds[0]), "dev"), os.NewFile(uintptr(fds[1]), "peer")
	defer dev.Close()
	banner := "SSH-2.0-Go\r\n"
	if _, err := peer.Write([]byte(banner)); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	for range 3 {
		if hup, err := pollHangup(dev); err != nil || !hup {
			t.Fatalf("hangup=%v err=%v, want true", hup, err)
		}
	}
	buf := make([]byte, 64)
	n, err := dev.Read(buf)
	if err != nil || string(buf[:n]) != banner {
		t.Fatalf("after polling: read %q, %v; want the bytes left alone (%q)", buf[:n], err, banner)
	}
}

// TestDevicePortReconnects runs the daemon loop of Main on a fake device:
// hosts connect and disconnect in turn, and the device is closed and
// opened again between them.
func TestDevicePortReconnects(t *testing.T) {
	master, slave := fakeDevice(t)
	cfg := Config{Logger: testLogger(t), Version: "v"}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	dev := &dupDevice{master: master}
	first, err := dev.open()
	if err != nil {
		t.Fatal(err)
	}
	// Never a timed check: the agent must wake when the host connects.
	port := &devicePort{f: first, reopen: dev.open, interval: time.Hour, recheck: time.Hour}
	go func() { done <- servePort(ctx, port, cfg) }()

	// Let the agent poll the hung-up device for a while first.
	time.Sleep(50 * time.Millisecond)
	for i := range 3 {
		h := connectHost(t, slave)
		c := agentconn.Client(h, testLogger(t))
		if _, err := c.Hello(t.Context()); err != nil {
			t.Fatalf("connection %d: hello: %v", i, err)
		}
		if res := run(t, c, argv("sh", "-c", "echo hi; echo there >&2"), nil); res.stdout != "hi\n" || res.stderr != "there\n" {
			t.Errorf("connection %d: %+v", i, res)
		}
		c.Close()
		h.Close()
		// A host connects again only once the agent has opened the port
		// afresh (vmgated waits for QEMU's VSERPORT_CHANGE event); here,
		// once the next open has happened.
		dev.wait(t, i+2)
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
	// One open per connection (the first one and one after each ended
	// connection); every one but the current one is closed.
	opened := dev.files()
	if len(opened) != 4 {
		t.Errorf("device opened %d times for 3 connections, want 4", len(opened))
	}
	for i, f := range opened[:len(opened)-1] {
		if _, err := f.Stat(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("open %d still open after its connection: %v", i, err)
		}
	}
	port.close()
	if _, err := opened[len(opened)-1].Stat(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("close left the device open: %v", err)
	}
}

// TestWaitHostEvent: the agent waits for a host without polling on a
// timer, and wakes when the host comes (a pty master, like the port, is
// woken by its peer's data; the port also when the host connects).
func TestWaitHostEvent(t *testing.T) {
	master, slave := fakeDevice(t)
	f, err := (&dupDevice{master: master}).open()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// No host: it waits until ctx ends, and ends then.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := waitHostEvent(ctx, f, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no host: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("ctx ended it after %v", d)
	}
	// A host that connects and writes wakes it, long before the recheck.
	done := make(chan error, 1)
	go func() {
		missed, err := waitHostEvent(context.Background(), f, time.Hour)
		if err == nil && missed {
			err = errors.New("reported as found by the recheck")
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	h := connectHost(t, slave)
	defer h.Close()
	if _, err := h.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(testTimeout):
		t.Fatal("the host's arrival did not wake the agent")
	}
	// The host's bytes are left for the connection.
	buf := make([]byte, 16)
	if n, err := f.Read(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	// A host already there: at once. A file Go's poller does not take:
	// ErrUnsupported, and the caller polls on a timer.
	if missed, err := waitHostEvent(context.Background(), f, time.Hour); err != nil || missed {
		t.Fatal(missed, err)
	}
	regular, err := os.CreateTemp(t.TempDir(), "regular")
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	if _, err := waitHostEvent(context.Background(), regular, time.Hour); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("a regular file: %v", err)
	}
}

// TestWaitHostEventReportsMissedWake: a host that comes while the agent
// waits, on a port that does not wake the agent, is found by the recheck
// and reported as missed, so that the safety net never hides a device that
// does not wake the agent. Nothing is left to timing: the port is one that
// the poller never reports (silentPort), so only the wait's deadline ends
// the wait, and the host comes right after the agent's first check; every
// check that finds no host is followed by a wait, so the second check is
// the recheck whatever the scheduling, even with a wait of 1 ms.
func TestWaitHostEventReportsMissedWake(t *testing.T) {
	port := silentPort(t)
	checks := 0
	hangup := func(uintptr) (bool, error) {
		checks++
		return checks == 1, nil // the host comes after the first check
	}
	missed, err := waitHostWith(context.Background(), port, time.Millisecond, hangup)
	if err != nil || !missed {
		t.Fatalf("a host found by the recheck: missed=%v err=%v, want missed", missed, err)
	}
	if checks != 2 {
		t.Errorf("%d checks, want 2 (the first one, and the recheck after the wait)", checks)
	}
}

// TestWaitHostEventHostAlreadyThere: a host connected before the wait is
// found at once, and not reported as missed.
func TestWaitHostEventHostAlreadyThere(t *testing.T) {
	master, slave := fakeDevice(t)
	f, err := (&dupDevice{master: master}).open()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := connectHost(t, slave)
	defer h.Close()
	if missed, err := waitHostEvent(context.Background(), f, time.Hour); err != nil || missed {
		t.Fatalf("host already there: missed=%v err=%v", missed, err)
	}
}

// silentPort returns a file that Go's poller takes but never reports: the
// write end of a pipe, full before the poller sees it (so that not even
// its registration is an event) and whose read end nobody reads.
func silentPort(t *testing.T) *os.File {
	t.Helper()
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK|unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]) })
	buf := make([]byte, 64<<10)
	for {
		if _, err := unix.Write(fds[1], buf); errors.Is(err, unix.EAGAIN) {
			break
		} else if err != nil {
			unix.Close(fds[1])
			t.Fatal(err)
		}
	}
	f := os.NewFile(uintptr(fds[1]), "silent-port")
	t.Cleanup(func() { f.Close() })
	return f
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

// dupDevice stands in for opening the port device again: the test keeps
// the pty master open, and each open is a new fd on it.
type dupDevice struct {
	master *os.File
	mu     sync.Mutex
	opened []*os.File
}

func (d *dupDevice) open() (*os.File, error) {
	fd, err := unix.Dup(int(d.master.Fd()))
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "device")
	d.mu.Lock()
	d.opened = append(d.opened, f)
	d.mu.Unlock()
	return f, nil
}

func (d *dupDevice) files() []*os.File {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*os.File(nil), d.opened...)
}

// wait waits until the device has been opened n times.
func (d *dupDevice) wait(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for len(d.files()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the device was not opened again (%d opens, want %d)", len(d.files()), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFileConnEOFEndsPendingWrites: a virtio-serial port blocks writers
// while no host is connected, so when the host hangs up, a write that is
// waiting must be ended by the connection itself, or it holds the SSH
// channel's lock for ever (and would later hand its bytes to the next
// host). A socket whose peer stops reading and shuts down its sending side
// shows both halves: writes block, reads return EOF.
func TestFileConnEOFEndsPendingWrites(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		t.Fatal(err)
	}
	dev := os.NewFile(uintptr(fds[0]), "dev")
	defer dev.Close()
	peer := os.NewFile(uintptr(fds[1]), "peer")
	defer peer.Close()
	c, err := newFileConn(dev)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan error, 1)
	go func() {
		_, err := c.Write(make([]byte, 64<<20))
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("a write larger than the socket buffers returned (%v) while nobody read", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := unix.Shutdown(fds[1], unix.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 16)); !errors.Is(err, io.EOF) {
		t.Fatalf("read after the peer's shutdown: %v, want EOF", err)
	}
	select {
	case err := <-wrote:
		if err == nil {
			t.Error("the pending write succeeded")
		}
	case <-time.After(testTimeout):
		t.Fatal("EOF did not end the pending write")
	}
}
