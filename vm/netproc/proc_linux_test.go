package netproc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/netwire"
	"github.com/vmgate/vmgate/internal/reexec"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netproc"
	"github.com/vmgate/vmgate/vm/netstack"
	"github.com/vmgate/vmgate/vm/netstack/netstacktest"
)

// startNetstack runs a real netstack listening where QEMU would
// connect, with an audit that collects its records: jailed by this
// process, or started for a connection to socket (as systemd does).
func startNetstack(t testing.TB, socket string) (*netproc.Proc, string, chan netstack.Record) {
	t.Helper()
	return startNetstackLog(t, socket, nil)
}

// startNetstackLog is startNetstack with the daemon side's log going to
// log.
func startNetstackLog(t testing.TB, socket string, log *slog.Logger) (*netproc.Proc, string, chan netstack.Record) {
	t.Helper()
	testutil.RequiresRoot(t)
	spec, err := vm.NetstackSpec("")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "net.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	lf, err := ul.File()
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	recs := make(chan netstack.Record, 16)
	p, err := netproc.Start(netproc.Config{Jail: spec, Socket: socket, Log: log, Policy: netstack.Policy{Audit: func(r netstack.Record) { recs <- r }}}, lf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, sock, recs
}

// udpFrame is an Ethernet frame of a UDP datagram from the guest to
// dst:port, as QEMU's stream netdev carries it.
func udpFrame(dst netip.Addr, port uint16) []byte {
	eth := []byte{0x52, 0x55, 0x0a, 0x00, 0x02, 0x02, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00}
	udp := make([]byte, 8+4)
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], port)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], "ping")
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
	src := netstack.GuestAddr.As4()
	d := dst.As4()
	copy(ip[12:], src[:])
	copy(ip[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	return append(append(eth, ip...), udp...) // UDP checksum 0: none
}

// TestNetstack_ChannelAndJail: the guest's traffic reaches the netstack
// process, its records reach the daemon's audit, and the process is
// jailed: no capabilities, no_new_privs, a seccomp filter, namespaces of
// its own except the network's.
func TestNetstack_ChannelAndJail(t *testing.T) {
	p, sock, recs := startNetstack(t, "")
	guestSends(t, sock, recs)
	pid := p.Pid()
	status := testutil.ReadFile(t, fmt.Sprintf("/proc/%d/status", pid))
	for _, want := range []string{"CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
		if !strings.Contains(status, want) {
			t.Errorf("netstack %d lacks %q:\n%s", pid, want, status)
		}
	}
	// Two filters: the jail's, and the one the netstack loads itself
	// after its start-up, which forbids exec and new processes.
	if mine, ok := seccompFilters(testutil.ReadFile(t, "/proc/self/status")); ok {
		if its, _ := seccompFilters(status); its != mine+2 {
			t.Errorf("netstack %d has %d seccomp filters, want %d (the jail's and its own)", pid, its, mine+2)
		}
	}
	for ns, same := range map[string]bool{"user": false, "mnt": false, "pid": false, "ipc": false, "uts": false, "net": true} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		its, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
		if err != nil {
			t.Fatal(err)
		}
		if (mine == its) != same {
			t.Errorf("%s namespace: netstack %s, this process %s", ns, its, mine)
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Rss:") || strings.HasPrefix(l, "Pss:") {
				t.Logf("netstack %s", strings.Join(strings.Fields(l), " "))
			}
		}
	}
	// Its root holds no state directory, audit log or image.
	if _, err := os.Stat(fmt.Sprintf("/proc/%d/root%s", pid, filepath.Dir(sock))); err == nil {
		t.Error("the netstack sees the VM directory")
	}
}

// guestSends sends a datagram as the guest would, through QEMU's socket,
// and checks that the netstack's record of it reaches the audit.
func guestSends(t *testing.T, sock string, recs chan netstack.Record) net.Conn {
	t.Helper()
	qemu, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qemu.Close() })
	if _, err := qemu.Write(netwire.AppendFrame(nil, udpFrame(netip.MustParseAddr("192.0.2.1"), 9999))); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-recs:
		if r.Proto != "udp" || r.Allowed || r.Port != 9999 || !strings.Contains(r.Reason, "UDP is not allowed") {
			t.Fatalf("record %+v", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no record of the refused datagram")
	}
	return qemu
}

// TestNetstack_SocketActivated: a netstack that systemd starts per
// connection (Accept=yes, StandardInput=socket, --channel-fd 0) gets its
// listening socket over the channel and reports as a jailed one does;
// it ends when the daemon closes the channel.
func TestNetstack_SocketActivated(t *testing.T) {
	socket, started := socketActivation(t)
	p, sock, recs := startNetstack(t, socket)
	guestSends(t, sock, recs)
	cmd := <-started
	p.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the instance after its channel closed: %v", err)
	}
}

// TestNetstack_FailedStartEnds: a start whose first message cannot be
// sent (here: the listening socket is already closed) fails, and leaves
// nothing waiting, for a netstack reached through a socket as for a
// jailed one.
func TestNetstack_FailedStartEnds(t *testing.T) {
	testutil.RequiresRoot(t)
	socket := filepath.Join(t.TempDir(), "netstack.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.HoldConns(t, ln)
	spec, err := vm.NetstackSpec("")
	if err != nil {
		t.Fatal(err)
	}
	for name, sock := range map[string]string{"socket": socket, "jail": ""} {
		dead, err := os.CreateTemp(t.TempDir(), "closed")
		if err != nil {
			t.Fatal(err)
		}
		dead.Close()
		done := make(chan error, 1)
		go func() {
			_, err := netproc.Start(netproc.Config{Jail: spec, Socket: sock}, dead)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s: a start without a listening socket succeeded", name)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: a failed start still waits after 30 s", name)
		}
	}
}

// socketActivation serves socket as systemd's vmgate-netstack.socket does
// (Accept=yes, StandardInput=socket, --channel-fd 0): the one instance it
// starts arrives on the channel.
func socketActivation(t *testing.T) (string, chan *exec.Cmd) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "netstack.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	started := make(chan *exec.Cmd, 1)
	go func() {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		f, _ := c.File()
		c.Close()
		cmd := exec.Command(self, "--channel-fd", "0")
		cmd.Env = []string{reexec.ChildEnv + "=" + netproc.Role}
		cmd.Stdin, cmd.Stderr = f, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Error(err)
		}
		f.Close()
		started <- cmd
	}()
	return socket, started
}

// TestNetstack_EndsWithQEMU: when QEMU's connection ends (its VM is
// destroyed, or QEMU died), the netstack has no one left to serve and
// exits by itself, without waiting for the daemon to close the channel,
// and the daemon does not take that for a failure.
func TestNetstack_EndsWithQEMU(t *testing.T) {
	for _, mode := range []string{"jail", "socket"} {
		t.Run(mode, func(t *testing.T) {
			var log bytes.Buffer
			var mu sync.Mutex
			logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &log}, nil))
			socket, started := "", chan *exec.Cmd(nil)
			if mode == "socket" {
				socket, started = socketActivation(t)
			}
			p, sock, recs := startNetstackLog(t, socket, logger)
			guestSends(t, sock, recs).Close()
			select {
			case <-p.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("the netstack still runs 30 s after QEMU's connection ended")
			}
			if started != nil {
				if err := (<-started).Wait(); err != nil {
					t.Errorf("the instance: %v", err)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if strings.Contains(log.String(), "level=ERROR") {
				t.Errorf("the daemon logged the netstack's end as a failure:\n%s", log.String())
			}
		})
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// seccompFilters reads Seccomp_filters from a /proc/PID/status (Linux
// 5.9 and later).
func seccompFilters(status string) (int, bool) {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "Seccomp_filters:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			return n, err == nil
		}
	}
	return 0, false
}

// TestNetstack_DialGuest: a connection into the guest goes through the
// netstack (its end of a socket pair passed over the channel; jailed, it
// runs under both its seccomp filters) and carries bytes both ways; a
// port nothing listens on is refused with the guest's answer. Jailed by
// this process and started per connection as systemd does.
func TestNetstack_DialGuest(t *testing.T) {
	t.Run("jailed", func(t *testing.T) {
		p, sock, _ := startNetstack(t, "")
		dialGuest(t, p, sock)
	})
	t.Run("socket-activated", func(t *testing.T) {
		socket, started := socketActivation(t)
		// Run after the netstack's Close (cleanups run last first): the
		// instance exits with its channel and is reaped.
		t.Cleanup(func() {
			if err := (<-started).Wait(); err != nil {
				t.Errorf("the instance: %v", err)
			}
		})
		p, sock, _ := startNetstack(t, socket)
		dialGuest(t, p, sock)
	})
}

func dialGuest(t *testing.T, p *netproc.Proc, sock string) {
	t.Helper()
	qemu, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { qemu.Close() })
	ln := netstacktest.Listen(t, netstacktest.Stack(t, qemu), 8000)
	netstacktest.Echo(ln)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := p.DialGuest(ctx, 8000)
	if err != nil {
		t.Fatalf("dial a listening port: %v", err)
	}
	defer c.Close()
	netstacktest.Ping(t, c)
	if _, err := p.DialGuest(ctx, 8001); !errors.Is(err, netstack.ErrGuestRefused) {
		t.Errorf("dial a closed port: %v, want %v", err, netstack.ErrGuestRefused)
	}
}

// TestNetstack_PolicyInForce: once SetPolicy returns, the netstack holds
// the guest to the new policy: the guest's next datagram is recorded
// under it, every time.
func TestNetstack_PolicyInForce(t *testing.T) {
	p, sock, recs := startNetstack(t, "")
	qemu := guestSends(t, sock, recs)
	for i := range 20 {
		mine := make(chan netstack.Record, 4)
		p.SetPolicy(netstack.Policy{Audit: func(r netstack.Record) { mine <- r }})
		if _, err := qemu.Write(netwire.AppendFrame(nil, udpFrame(netip.MustParseAddr("192.0.2.1"), uint16(10000+i)))); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-mine:
			if r.Port != uint16(10000+i) {
				t.Fatalf("policy %d: record %+v", i, r)
			}
		case r := <-recs:
			t.Fatalf("policy %d: the datagram was recorded under the first policy: %+v", i, r)
		case <-time.After(30 * time.Second):
			t.Fatalf("policy %d: no record of the datagram", i)
		}
	}
}

// BenchmarkNetstack_SetPolicy: what a command's policy costs now that
// SetPolicy waits for the netstack to say it is in force (a round trip
// over the channel, on every command with a NIC).
func BenchmarkNetstack_SetPolicy(b *testing.B) {
	p, _, _ := startNetstack(b, "")
	pol := netstack.Policy{Audit: func(netstack.Record) {}}
	for b.Loop() {
		p.SetPolicy(pol)
	}
}
