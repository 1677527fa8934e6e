package gateway

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/policy"
)

// TestListenerAddr: the daemon publishes only a listening stream socket,
// TCP or a Unix socket with a path, and takes its address from the
// kernel; anything else a client passes is refused with the reason.
func TestListenerAddr(t *testing.T) {
	fileOf := func(t *testing.T, c interface{ File() (*os.File, error) }) *os.File {
		t.Helper()
		f, err := c.File()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	path := filepath.Join(t.TempDir(), "s.sock")
	ux, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ux.Close()
	for name, c := range map[string]struct {
		ln   interface{ File() (*os.File, error) }
		want policy.HostAddr
	}{
		"tcp":  {tcp.(*net.TCPListener), policy.HostAddr{Addr: netip.MustParseAddrPort(tcp.Addr().String())}},
		"unix": {ux.(*net.UnixListener), policy.HostAddr{Unix: path}},
	} {
		got, err := listenerAddr(fileOf(t, c.ln))
		if err != nil || got != c.want {
			t.Errorf("%s: %+v %v, want %+v", name, got, err, c.want)
		}
	}

	abstract, err := net.Listen("unix", "@vmgate-test-abstract")
	if err != nil {
		t.Fatal(err)
	}
	defer abstract.Close()
	udp, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	dialed, err := net.Dial("tcp", tcp.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	unbound, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	notListening := os.NewFile(uintptr(unbound), "unbound")
	defer notListening.Close()
	regular, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer regular.Close()
	for name, c := range map[string]struct {
		f    *os.File
		want string
	}{
		"abstract Unix socket": {fileOf(t, abstract.(*net.UnixListener)), "without a path"},
		"UDP socket":           {fileOf(t, udp.(*net.UDPConn)), "not a listening stream socket"},
		"connected TCP socket": {fileOf(t, dialed.(*net.TCPConn)), "not a listening stream socket"},
		"socket not listening": {notListening, "not a listening stream socket"},
		"not a socket":         {regular, "not a socket"},
	} {
		if got, err := listenerAddr(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %+v %v, want an error with %q", name, got, err, c.want)
		}
	}
}
