package gateway

// Descriptors that callers hand the daemon (a published port's listening
// socket), and connections the daemon accepts on a caller's listening
// socket. Closing either must never wait: Linux's tcp_close waits out a
// socket's linger time (SO_LINGER on, data unsent) whatever O_NONBLOCK
// says, a caller chooses both the setting and, by not reading, the unsent
// data, and accepted connections inherit their listening socket's setting.
// A close that waits would hold a request in flight, a lock, or the
// reaper, and a stop would never pause the sessions (issue 43, finding 1).

import (
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// maxPassedFDs is the most descriptors one message can carry (the
// kernel's SCM_MAX_FD): a receive with room for them all is never
// truncated, so the kernel never closes a dropped one in the daemon's
// thread.
const maxPassedFDs = 253

// lingerOff makes closing c return at once, with the kernel sending what
// is left in the background: for connections the daemon accepts on a
// caller's listening socket, whose data must still reach their client.
func lingerOff(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(-1)
	}
}

// dropPassed closes a descriptor a caller passed, without waiting on it.
// A listening socket closes at once. Any other socket is reset first
// (linger on, time 0: what it has not sent is the caller's, and it is
// refused anyway); the reset is the socket's, so the caller's own copy of
// it resets too. Anything else (a file whose file system may block in
// close) is closed off the caller's goroutine.
func dropPassed(fd int) {
	if _, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil {
		go unix.Close(fd)
		return
	}
	if l, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || l != 1 {
		_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	}
	unix.Close(fd)
}

// dropPassedFile is dropPassed for a descriptor wrapped in f.
func dropPassedFile(f *os.File) {
	fd, err := unix.Dup(int(f.Fd()))
	f.Close() // a copy: not the last, it never waits
	if err == nil {
		dropPassed(fd)
	}
}
