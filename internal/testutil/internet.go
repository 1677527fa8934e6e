package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Internet is a test "internet": a network namespace of its own, joined
// to the host by a veth pair, holding one address on a documentation
// range (TEST-NET-2, an ordinary public address to vmgate's rules). Its
// listeners live in that namespace, so what reaches them really crossed
// from the host.
type Internet struct {
	Addr netip.Addr // the server address inside the namespace
	ns   string
}

// RequiresInternet builds an Internet (root and iproute2 needed) and
// removes it at the end of the test.
func RequiresInternet(t testing.TB) *Internet {
	t.Helper()
	RequiresRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		SkipOrFail(t, "ip (iproute2) not installed")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	in := &Internet{Addr: netip.MustParseAddr("198.51.100.10"), ns: "vmgate-inet-" + id}
	host, peer := "vgi"+id+"h", "vgi"+id+"p"
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	run("netns", "add", in.ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", in.ns).Run() })
	run("link", "add", host, "type", "veth", "peer", "name", peer)
	t.Cleanup(func() { _ = exec.Command("ip", "link", "del", host).Run() })
	run("link", "set", peer, "netns", in.ns)
	run("addr", "add", "198.51.100.1/24", "dev", host)
	run("link", "set", host, "up")
	run("-n", in.ns, "addr", "add", in.Addr.String()+"/24", "dev", peer)
	run("-n", in.ns, "link", "set", peer, "up")
	run("-n", in.ns, "link", "set", "lo", "up")
	return in
}

// Listen opens a TCP listener on the Internet's address, inside its
// namespace.
func (in *Internet) Listen(t testing.TB, port int) net.Listener {
	t.Helper()
	var ln net.Listener
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		// setns changes only this thread: lock it, and let it die with
		// the goroutine if it cannot return to the host namespace.
		runtime.LockOSThread()
		orig, oerr := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if oerr != nil {
			err = oerr
			return
		}
		defer orig.Close()
		target, terr := os.Open("/var/run/netns/" + in.ns)
		if terr != nil {
			err = terr
			return
		}
		defer target.Close()
		if err = unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			return
		}
		ln, err = net.Listen("tcp", netip.AddrPortFrom(in.Addr, uint16(port)).String())
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
	}()
	<-done
	if err != nil {
		t.Fatalf("listen in %s: %v", in.ns, err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}
