package netproc

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/netstack"
)

// TestReadToChild: the netstack takes a dial only with exactly one fd and
// nothing else, and a policy only without one.
func TestReadToChild(t *testing.T) {
	daemon, child := testutil.SeqpacketPair(t)
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	buf := make([]byte, MaxMessage+1)
	for _, c := range []struct {
		name, msg string
		fds       int
		ok, pair  bool
	}{
		{"policy", `{"gen":2,"policy":{"rules":[],"max_conns":1,"max_bytes":1,"connect_rate":1}}`, 0, true, false},
		{"dial", `{"gen":0,"dial":{"port":8000}}`, 1, true, true},
		{"dial without its fd", `{"gen":0,"dial":{"port":8000}}`, 0, false, false},
		{"dial with two fds", `{"gen":0,"dial":{"port":8000}}`, 2, false, false},
		{"dial with a policy", `{"gen":0,"dial":{"port":8000},"policy":{"rules":[],"max_conns":1,"max_bytes":1,"connect_rate":1}}`, 1, false, false},
		{"dial with a generation", `{"gen":3,"dial":{"port":8000}}`, 1, false, false},
		{"policy with an fd", `{"gen":2}`, 1, false, false},
		{"unknown field", `{"gen":0,"dial":{"port":8000,"addr":"10.0.2.15"}}`, 1, false, false},
	} {
		var oob []byte
		if c.fds > 0 {
			rights := make([]int, c.fds)
			for i := range rights {
				rights[i] = int(devNull.Fd())
			}
			oob = unix.UnixRights(rights...)
		}
		if _, _, err := daemon.WriteMsgUnix([]byte(c.msg), oob, nil); err != nil {
			t.Fatal(err)
		}
		m, pair, err := readToChild(child, buf)
		if (err == nil) != c.ok || (pair != nil) != c.pair {
			t.Errorf("%s: message %+v, fd %v, error %v", c.name, m, pair != nil, err)
		}
		if pair != nil {
			pair.Close()
		}
	}
	daemon.Close()
	if _, _, err := readToChild(child, buf); !errors.Is(err, errChannelClosed) {
		t.Errorf("after the daemon closed: %v", err)
	}
}

// TestDialStatus: every outcome of a dial crosses as a byte the daemon
// reads back as the same outcome, and a byte no netstack sends is an
// error.
func TestDialStatus(t *testing.T) {
	for _, err := range []error{nil, netstack.ErrGuestRefused, netstack.ErrGuestUnreachable} {
		if got := dialStatusError(dialStatus(err)); (got == nil) != (err == nil) || err != nil && !errors.Is(got, err) {
			t.Errorf("%v crosses as %v", err, got)
		}
	}
	for _, b := range []byte{dialBusy, dialFailed, 5, 255} {
		if dialStatusError(b) == nil {
			t.Errorf("status %d reads as connected", b)
		}
	}
}

// TestReadToChild_DialDropped: a dial whose descriptor the kernel could
// not deliver (this process holds every descriptor it may) is that one
// dial lost, not a broken channel: the netstack goes on serving.
func TestReadToChild_DialDropped(t *testing.T) {
	daemon, child := testutil.SeqpacketPair(t)
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	if _, _, err := daemon.WriteMsgUnix([]byte(`{"gen":0,"dial":{"port":8000}}`), unix.UnixRights(int(devNull.Fd())), nil); err != nil {
		t.Fatal(err)
	}
	// No descriptor left: fill every free number below a new limit.
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var fill []int
	defer func() {
		for _, fd := range fill {
			unix.Close(fd)
		}
	}()
	top := 0
	for range 64 {
		fd, err := unix.Dup(int(devNull.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		fill = append(fill, fd)
		top = max(top, fd)
	}
	low := lim
	low.Cur = uint64(top + 1)
	holes := 0
	for fd := 0; fd <= top; fd++ {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			holes++
		}
	}
	if holes > 0 {
		t.Skipf("%d descriptor numbers below %d are free after 64 dups", holes, top)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	m, pair, err := readToChild(child, make([]byte, MaxMessage+1))
	_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	if !errors.Is(err, errDialDropped) || pair != nil || m.Dial == nil || m.Dial.Port != 8000 {
		t.Fatalf("a dial without its descriptor: %+v %v %v, want the dial and errDialDropped", m, pair, err)
	}
}
