package testutil

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// LingeringSocket returns the descriptor of a TCP socket whose close
// waits: SO_LINGER on for 30 s, with data its peer (never accepted, with a
// small receive buffer) does not take. It is the only descriptor of its
// socket.
func LingeringSocket(t testing.TB) int {
	t.Helper()
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(s uintptr) { _ = unix.SetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_RCVBUF, 2048) })
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	_ = raw.Control(func(s uintptr) { fd, err = unix.Dup(int(s)) })
	c.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64<<10)
	for {
		if _, err := unix.Write(fd, buf); errors.Is(err, unix.EAGAIN) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	if n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQNSD); err != nil || n == 0 {
		t.Fatalf("the socket has %d bytes unsent (%v): its close would not wait", n, err)
	}
	if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 30}); err != nil {
		t.Fatal(err)
	}
	return fd
}
