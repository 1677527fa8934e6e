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
	ConfigureNetwork(con)
}

// ConfigureNetwork sets the loopback up and gives the first NIC, if there
// is one, the guest address and a default route through the gateway
// (netconf), reporting on con. It is an imported root's network whether
// the agent is its init (setupRoot) or its own systemd runs it as a unit
// (NetworkRoleName). Interfaces are named by index, never by name: udev
// may rename the NIC while this runs (eth0 -> enp0s2), and an index does
// not change.
func ConfigureNetwork(con io.Writer) {
	if err := configureLink(1, netip.Prefix{}); err != nil { // lo is always 1
		say(con, "loopback: %v", err)
	}
	if nic := firstNIC("/sys/class/net"); nic != "" {
		index, err := ifIndex(nic)
		if err == nil {
			err = configureLink(index, netconf.Guest)
		}
		if err != nil {
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

// ifIndex is the index of the interface name, read off sysfs.
func ifIndex(name string) (uint32, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/net", name, "ifindex"))
	if err != nil {
		return 0, err
	}
	var index uint32
	if _, err := fmt.Sscan(string(b), &index); err != nil {
		return 0, fmt.Errorf("ifindex: %w", err)
	}
	return index, nil
}

// configureLink gives interface index the address pfx (none when pfx is
// not valid), sets it up and, with an address, adds the default route
// through the gateway.
func configureLink(index uint32, pfx netip.Prefix) error {
	if pfx.IsValid() {
		if err := netlinkDo(addrMessage(index, pfx)); err != nil {
			return fmt.Errorf("address: %w", err)
		}
	}
	if err := netlinkDo(linkUpMessage(index)); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if !pfx.IsValid() {
		return nil
	}
	if err := netlinkDo(routeMessage(index, netconf.Gateway)); err != nil {
		return fmt.Errorf("route: %w", err)
	}
	return nil
}

// nlAttr is one rtnetlink attribute (payloads of 4 bytes or a multiple:
// already aligned).
func nlAttr(typ uint16, payload []byte) []byte {
	b := make([]byte, 4, 4+len(payload))
	binary.NativeEndian.PutUint16(b[0:], uint16(4+len(payload)))
	binary.NativeEndian.PutUint16(b[2:], typ)
	return append(b, payload...)
}

// nlMessage is an rtnetlink request of type typ with flags (besides
// NLM_F_REQUEST and NLM_F_ACK) and body (pure).
func nlMessage(typ, flags uint16, body []byte) []byte {
	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.SizeofNlMsghdr+len(body)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK|flags)
	binary.NativeEndian.PutUint32(msg[8:], 1) // sequence
	return append(msg, body...)
}

// routeMessage is the rtnetlink request that adds a default IPv4 route
// through gw on interface index (pure; tested).
func routeMessage(index uint32, gw netip.Addr) []byte {
	g := gw.As4()
	var oif [4]byte
	binary.NativeEndian.PutUint32(oif[:], index)
	body := []byte{unix.AF_INET, 0, 0, 0, unix.RT_TABLE_MAIN, unix.RTPROT_BOOT, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST, 0, 0, 0, 0}
	body = append(body, nlAttr(unix.RTA_GATEWAY, g[:])...)
	body = append(body, nlAttr(unix.RTA_OIF, oif[:])...)
	return nlMessage(unix.RTM_NEWROUTE, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body)
}

// addrMessage is the rtnetlink request that gives interface index the
// IPv4 address pfx (pure; tested).
func addrMessage(index uint32, pfx netip.Prefix) []byte {
	a := pfx.Addr().As4()
	body := make([]byte, unix.SizeofIfAddrmsg)
	body[0], body[1], body[3] = unix.AF_INET, byte(pfx.Bits()), unix.RT_SCOPE_UNIVERSE
	binary.NativeEndian.PutUint32(body[4:], index)
	body = append(body, nlAttr(unix.IFA_LOCAL, a[:])...)
	body = append(body, nlAttr(unix.IFA_ADDRESS, a[:])...)
	return nlMessage(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_REPLACE, body)
}

// linkUpMessage is the rtnetlink request that sets interface index up
// (pure; tested).
func linkUpMessage(index uint32) []byte {
	body := make([]byte, unix.SizeofIfInfomsg)
	body[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(body[4:], index)
	binary.NativeEndian.PutUint32(body[8:], unix.IFF_UP)  // flags
	binary.NativeEndian.PutUint32(body[12:], unix.IFF_UP) // change
	return nlMessage(unix.RTM_NEWLINK, 0, body)
}

// netlinkDo sends one rtnetlink request and reads its acknowledgement.
func netlinkDo(msg []byte) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return err
	}
	if n < unix.SizeofNlMsghdr+4 || binary.NativeEndian.Uint16(buf[4:]) != unix.NLMSG_ERROR {
		return errors.New("unexpected netlink answer")
	}
	if e := int32(binary.NativeEndian.Uint32(buf[unix.SizeofNlMsghdr:])); e != 0 {
		return syscall.Errno(-e)
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
