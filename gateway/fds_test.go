package gateway

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/testutil"
)

// TestDropPassedNeverWaits: a socket a caller passed whose close would
// wait out its linger time (30 s here) is dropped at once, and so are a
// listening socket and a file.
func TestDropPassedNeverWaits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lf, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dup := func(fd uintptr) int {
		d, err := unix.Dup(int(fd))
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	for name, fd := range map[string]int{"lingering socket": testutil.LingeringSocket(t), "listening socket": dup(lf.Fd()), "file": dup(f.Fd())} {
		t0 := time.Now()
		dropPassed(fd)
		if d := time.Since(t0); d > 2*time.Second {
			t.Errorf("%s: dropped in %v", name, d)
		}
	}
}

// TestTakeListenerDropsExtras: a message with more than the one
// descriptor is refused, and the extra descriptors, a lingering socket
// among them, are dropped without waiting.
func TestTakeListenerDropsExtras(t *testing.T) {
	ca, b := testutil.SocketPair(t)
	a := ca.(*net.UnixConn)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lf, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	linger := testutil.LingeringSocket(t)
	if _, _, err := a.WriteMsgUnix([]byte{0}, unix.UnixRights(int(lf.Fd()), linger), nil); err != nil {
		t.Fatal(err)
	}
	// The sent copy is the socket's last descriptor: whoever closes it
	// waits, unless it is reset first.
	unix.Close(linger)
	t0 := time.Now()
	_, err = takeListener(b)
	if err == nil || !strings.Contains(err.Error(), "one byte with one descriptor") {
		t.Errorf("two descriptors: %v", err)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("refused in %v", d)
	}
}
