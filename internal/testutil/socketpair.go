package testutil

import (
	"net"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// SocketPair returns the two ends of a connected Unix stream socket pair:
// real sockets, as the agent's port and the host's agent socket are.
func SocketPair(t testing.TB) (net.Conn, net.Conn) {
	t.Helper()
	return socketPair(t, unix.SOCK_STREAM)
}

// SeqpacketPair returns the two ends of a connected Unix SOCK_SEQPACKET
// pair, as the daemon's channel to a VM's netstack is.
func SeqpacketPair(t testing.TB) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	a, b := socketPair(t, unix.SOCK_SEQPACKET)
	return a.(*net.UnixConn), b.(*net.UnixConn)
}

func socketPair(t testing.TB, typ int) (net.Conn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	t.Cleanup(func() { conns[0].Close(); conns[1].Close() })
	return conns[0], conns[1]
}
