//go:build linux

package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// netInterfaces lists the interfaces of the probe's network namespace from
// /proc/self/net/dev, falling back to netlink.
func netInterfaces() ([]string, error) {
	f, err := os.Open("/proc/self/net/dev")
	if err == nil {
		defer f.Close()
		var names []string
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			name, _, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue // the two header lines have "|" but no ":"
			}
			names = append(names, strings.TrimSpace(name))
		}
		if sc.Err() == nil {
			return names, nil
		}
	}
	ifs, nerr := net.Interfaces()
	if nerr != nil {
		return nil, fmt.Errorf("list interfaces: /proc/self/net/dev: %v; netlink: %w", err, nerr)
	}
	names := make([]string, len(ifs))
	for i, fi := range ifs {
		names[i] = fi.Name
	}
	return names, nil
}

// emptyNetns reports whether the namespace has no interface but lo, so no
// packet can leave it. The string describes what was seen.
func emptyNetns() (bool, string) {
	names, err := netInterfaces()
	if err != nil {
		return false, "cannot tell whether the network namespace is empty: " + errText(err)
	}
	for _, n := range names {
		if n != "lo" {
			return false, fmt.Sprintf("network namespace has interfaces %v", names)
		}
	}
	return true, fmt.Sprintf("network namespace has only %v", names)
}

// socketAttempt creates a socket of the family; on success it tries to reach
// the targets, but only from an empty namespace, where nothing can leave.
func socketAttempt(family int, familyName, network string, targets []string) outcome {
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("socket(%s): %s", familyName, errText(err))}
	}
	unix.Close(fd)
	empty, seen := emptyNetns()
	if !empty {
		return outcome{blocked: false, detail: fmt.Sprintf("socket(%s): succeeded; %s, so no connect was tried (it could leave the namespace)", familyName, seen)}
	}
	blocked := true
	parts := []string{fmt.Sprintf("socket(%s): succeeded; %s", familyName, seen)}
	for _, t := range targets {
		conn, err := net.DialTimeout(network, t, 2*time.Second)
		if err != nil {
			parts = append(parts, "connect "+t+": "+errText(err))
			continue
		}
		conn.Close()
		blocked = false
		parts = append(parts, "connect "+t+": CONNECTED")
	}
	return outcome{blocked: blocked, detail: strings.Join(parts, "; ")}
}

func socketInet(*config) outcome {
	return socketAttempt(unix.AF_INET, "AF_INET", "tcp4", []string{"127.0.0.1:22", "1.1.1.1:53"})
}

func socketInet6(*config) outcome {
	return socketAttempt(unix.AF_INET6, "AF_INET6", "tcp6", []string{"[::1]:22", "[2606:4700:4700::1111]:53"})
}

// containedSocket creates a socket; success counts as contained only when
// the namespace it lives in has no interface but lo.
func containedSocket(family, typ, proto int, what string) outcome {
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return outcome{blocked: true, detail: what + ": " + errText(err)}
	}
	unix.Close(fd)
	empty, seen := emptyNetns()
	if empty {
		return outcome{blocked: true, detail: what + ": succeeded; contained: " + seen}
	}
	return outcome{blocked: false, detail: what + ": succeeded; " + seen}
}

func socketNetlink(*config) outcome {
	return containedSocket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE, "socket(AF_NETLINK, NETLINK_ROUTE)")
}

func socketPacket(*config) outcome {
	return containedSocket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)), "socket(AF_PACKET, SOCK_RAW)")
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func socketVsock(*config) outcome {
	fd, err := unix.Socket(unix.AF_VSOCK, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return outcome{blocked: true, detail: "socket(AF_VSOCK): " + errText(err)}
	}
	unix.Close(fd)
	return outcome{blocked: false, detail: "socket(AF_VSOCK): succeeded (vsock is not namespaced)"}
}

func connectHostSocket(c *config) outcome {
	if c.hostSocket == "" {
		return skip("no --host-socket given")
	}
	conn, err := net.DialTimeout("unix", c.hostSocket, 2*time.Second)
	if err == nil {
		conn.Close()
		return outcome{blocked: false, detail: "connect " + c.hostSocket + ": CONNECTED"}
	}
	if isErrno(err, unix.ENOENT, unix.EACCES, unix.ECONNREFUSED, unix.EPERM, unix.ENOTDIR) {
		return outcome{blocked: true, detail: errText(err)}
	}
	return outcome{blocked: false, detail: errText(err) + ": the socket may be reachable"}
}

// abstractSocket is one listening abstract Unix socket from /proc/net/unix.
type abstractSocket struct {
	name string // without the leading "@"
	typ  int
}

// abstractSockets lists the abstract Unix sockets visible in the probe's
// network namespace that accept connects: listening stream or seqpacket
// sockets, and datagram sockets.
func abstractSockets() ([]abstractSocket, error) {
	b, err := os.ReadFile("/proc/self/net/unix")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []abstractSocket
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// Num RefCount Protocol Flags Type St Inode Path
		f := strings.Fields(line)
		if len(f) < 8 || !strings.HasPrefix(f[7], "@") {
			continue
		}
		var typ int
		switch f[4] {
		case "0001":
			typ = unix.SOCK_STREAM
		case "0002":
			typ = unix.SOCK_DGRAM
		case "0005":
			typ = unix.SOCK_SEQPACKET
		default:
			continue
		}
		const acceptCon = "00010000"
		if typ != unix.SOCK_DGRAM && f[3] != acceptCon {
			continue
		}
		name := strings.TrimPrefix(f[7], "@")
		if seen[name] {
			continue
		}
		seen[name] = true
		out = append(out, abstractSocket{name: name, typ: typ})
	}
	return out, nil
}

func connectAbstractUnix(*config) outcome {
	socks, err := abstractSockets()
	if err != nil {
		return outcome{blocked: true, detail: "list abstract sockets: " + errText(err)}
	}
	if len(socks) == 0 {
		return outcome{blocked: true, detail: "no listening abstract Unix socket visible in /proc/self/net/unix"}
	}
	parts := []string{fmt.Sprintf("%d listening abstract sockets visible", len(socks))}
	blocked := true
	for i, s := range socks {
		if i == 3 {
			break
		}
		fd, err := unix.Socket(unix.AF_UNIX, s.typ|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			parts = append(parts, "socket: "+errText(err))
			continue
		}
		// /proc shows NULs in names as '@'; such names may not match.
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + s.name})
		unix.Close(fd)
		if err != nil && !isErrno(err, unix.EAGAIN, unix.EINPROGRESS) {
			parts = append(parts, fmt.Sprintf("connect @%s: %s", s.name, errText(err)))
			continue
		}
		blocked = false
		if err != nil {
			parts = append(parts, fmt.Sprintf("connect @%s: REACHABLE (%s)", s.name, errText(err)))
		} else {
			parts = append(parts, fmt.Sprintf("connect @%s: CONNECTED", s.name))
		}
	}
	return outcome{blocked: blocked, detail: strings.Join(parts, "; ")}
}
