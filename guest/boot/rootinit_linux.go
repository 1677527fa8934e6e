package boot

// The init of an imported root (agentproto.RootInitMarker): such a root
// has no init system, so after the initramfs the agent binary runs again
// as PID 1 there. It mounts what a command expects (/dev/pts, /dev/shm,
// /run), names the host, configures the NIC, if there is one, with the
// static addresses vmgated's network serves, starts the agent daemon as
// its child (restarted if it dies) and reaps every orphan.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/netconf"

	"golang.org/x/sys/unix"
)

// RunRoot is PID 1 of an imported root. It never returns.
func RunRoot() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "vmgate-init: not running as PID 1, refusing to start")
		os.Exit(1)
	}
	con := openConsole()
	setupRoot(linuxSystem{console: con}, con)
	superviseAgent(con)
}

// rootMounts are mounted on an imported root after the initramfs moved
// /dev, /proc and /sys there.
var rootMounts = []struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666"},
	{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
}

// setupRoot prepares the root; what fails is reported and the rest goes on,
// so that the agent can still serve (and the host see what is missing).
func setupRoot(s system, con io.Writer) {
	for _, m := range rootMounts {
		_ = os.MkdirAll(m.target, 0o755)
		if err := s.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, syscall.EBUSY) {
			say(con, "mount %s on %s: %v", m.fstype, m.target, err)
		}
	}
	if err := unix.Sethostname([]byte("vmgate")); err != nil {
		say(con, "hostname: %v", err)
	}
	if err := linkUp("lo"); err != nil {
		say(con, "loopback: %v", err)
	}
	if nic := firstNIC("/sys/class/net"); nic != "" {
		if err := configureNIC(nic); err != nil {
			say(con, "network %s: %v", nic, err)
		} else {
			say(con, "network %s: %s via %s", nic, netconf.Guest, netconf.Gateway)
		}
	}
}

// firstNIC is the first network interface other than loopback, or "".
func firstNIC(sysNet string) string {
	ents, _ := os.ReadDir(sysNet)
	for _, e := range ents {
		if e.Name() != "lo" {
			return e.Name()
		}
	}
	return ""
}

func ifreqIoctl(name string, req uint, set func(*unix.Ifreq) error) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	if set != nil {
		if err := set(ifr); err != nil {
			return err
		}
	}
	if err := unix.IoctlIfreq(fd, req, ifr); err != nil {
		return err
	}
	if req == unix.SIOCGIFFLAGS {
		return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, withUp(ifr))
	}
	return nil
}

func withUp(ifr *unix.Ifreq) *unix.Ifreq {
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return ifr
}

// linkUp sets an interface up.
func linkUp(name string) error { return ifreqIoctl(name, unix.SIOCGIFFLAGS, nil) }

// configureNIC gives name the guest address and a default route through
// the gateway.
func configureNIC(name string) error {
	pfx := netconf.Guest
	addr := pfx.Addr().As4()
	maskBytes := maskOf(pfx.Bits())
	if err := ifreqIoctl(name, unix.SIOCSIFADDR, func(r *unix.Ifreq) error { return r.SetInet4Addr(addr[:]) }); err != nil {
		return fmt.Errorf("address: %w", err)
	}
	if err := ifreqIoctl(name, unix.SIOCSIFNETMASK, func(r *unix.Ifreq) error { return r.SetInet4Addr(maskBytes[:]) }); err != nil {
		return fmt.Errorf("netmask: %w", err)
	}
	if err := linkUp(name); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	iface, err := os.ReadFile(filepath.Join("/sys/class/net", name, "ifindex"))
	if err != nil {
		return err
	}
	var index uint32
	if _, err := fmt.Sscan(string(iface), &index); err != nil {
		return fmt.Errorf("ifindex: %w", err)
	}
	return addDefaultRoute(index, netconf.Gateway)
}

func maskOf(bits int) [4]byte {
	var m [4]byte
	binary.BigEndian.PutUint32(m[:], ^uint32(0)<<(32-bits))
	return m
}

// routeMessage is the rtnetlink request that adds a default IPv4 route
// through gw on interface index (pure; tested).
func routeMessage(index uint32, gw netip.Addr) []byte {
	attr := func(typ uint16, payload []byte) []byte {
		b := make([]byte, 4, 4+len(payload))
		binary.NativeEndian.PutUint16(b[0:], uint16(4+len(payload)))
		binary.NativeEndian.PutUint16(b[2:], typ)
		return append(b, payload...) // 4-byte payloads: already aligned
	}
	g := gw.As4()
	var oif [4]byte
	binary.NativeEndian.PutUint32(oif[:], index)
	body := []byte{unix.AF_INET, 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST, 0, 0, 0, 0}
	body = append(body, attr(unix.RTA_GATEWAY, g[:])...)
	body = append(body, attr(unix.RTA_OIF, oif[:])...)
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], unix.RTM_NEWROUTE)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
	binary.NativeEndian.PutUint32(msg[8:], 1) // sequence
	return append(msg, body...)
}

func addDefaultRoute(index uint32, gw netip.Addr) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, routeMessage(index, gw), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	if n < unix.SizeofNlMsghdr+4 || binary.NativeEndian.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return errors.New("route: unexpected netlink answer")
	}
	if e := int32(binary.NativeEndian.Uint32(buf[unix.SizeofNlMsghdr:])); e != 0 {
		return fmt.Errorf("route: %w", syscall.Errno(-e))
	}
	return nil
}

// superviseAgent runs the agent daemon as a child, restarting it when it
// ends, and reaps every other process that ends under PID 1.
func superviseAgent(con io.Writer) {
	start := func() int {
		cmd := exec.Command("/proc/self/exe")
		cmd.Args = []string{"vmgate-agent"}
		cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/"}
		cmd.Stdout, cmd.Stderr = con, con
		if err := cmd.Start(); err != nil {
			say(con, "start agent: %v", err)
			return -1
		}
		return cmd.Process.Pid
	}
	agent := start()
	for {
		if agent < 0 {
			time.Sleep(time.Second)
			agent = start()
			continue
		}
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err != nil {
			if !errors.Is(err, unix.EINTR) {
				time.Sleep(100 * time.Millisecond)
			}
			continue
		}
		if pid == agent {
			say(con, "agent ended (%v); restarting it", ws)
			time.Sleep(200 * time.Millisecond)
			agent = start()
		}
	}
}
