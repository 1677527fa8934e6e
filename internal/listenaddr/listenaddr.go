// Package listenaddr parses the addresses the daemon's front doors listen
// on (--ssh-listen, --e2b-listen): an IP literal and a port, or a Unix
// socket's absolute path. Host names are refused: a door is bound to the
// address the operator wrote, never to what a name resolves to.
package listenaddr

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
)

// Addr is a parsed listen address.
type Addr struct {
	Network string // "tcp" or "unix"
	Addr    string // "127.0.0.1:2222", "[::1]:2222" or "/run/vmgate/ssh.sock"
	// Loopback is set for a loopback IP, and always for a Unix socket.
	Loopback bool
}

// Parse parses "unix:/abs/path" or "IP:PORT" ("[IPv6]:PORT"); door ("ssh",
// "e2b") names the flag in messages.
func Parse(door, s string) (Addr, error) {
	if p, ok := strings.CutPrefix(s, "unix:"); ok {
		switch {
		case !filepath.IsAbs(p) || filepath.Clean(p) != p:
			return Addr{}, fmt.Errorf("%s listen %q: want unix:/ABSOLUTE/CLEAN/PATH", door, s)
		case len(p) >= 108:
			return Addr{}, fmt.Errorf("%s listen %q: socket path too long (max 107 bytes)", door, s)
		}
		return Addr{Network: "unix", Addr: p, Loopback: true}, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return Addr{}, fmt.Errorf("%s listen %q: want IP:PORT or unix:/PATH: %w", door, s, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || strconv.FormatUint(n, 10) != port {
		return Addr{}, fmt.Errorf("%s listen %q: port %q: want a number 0 to 65535", door, s, port)
	}
	if host == "" {
		return Addr{}, fmt.Errorf("%s listen %q: no address: give one, e.g. 127.0.0.1:%s (0.0.0.0 for every interface, with --%s-allow-remote)", door, s, port, door)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return Addr{}, fmt.Errorf("%s listen %q: %q is not an IP address without zone: use 127.0.0.1 or ::1, not a host name", door, s, host)
	}
	ip = ip.Unmap()
	return Addr{Network: "tcp", Addr: netip.AddrPortFrom(ip, uint16(n)).String(), Loopback: ip.IsLoopback()}, nil
}

// ParseAll parses a door's addresses and lists the non-loopback ones,
// among them and among the listeners already open, for the door to
// refuse or log as a relaxation.
func ParseAll(door string, listen []string, open []net.Listener) (addrs []Addr, remote []string, err error) {
	for _, s := range listen {
		a, err := Parse(door, s)
		if err != nil {
			return nil, nil, err
		}
		if !a.Loopback {
			remote = append(remote, a.Addr)
		}
		addrs = append(addrs, a)
	}
	for _, ln := range open {
		if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
			remote = append(remote, ta.String())
		}
	}
	return addrs, remote, nil
}

// Listen opens a: a TCP listener, or a Unix socket made by listenUnix
// (the daemon's, which sets the socket's mode and group).
func (a Addr) Listen(listenUnix func(path string) (net.Listener, error)) (net.Listener, error) {
	if a.Network == "unix" {
		return listenUnix(a.Addr)
	}
	return net.Listen("tcp", a.Addr)
}
