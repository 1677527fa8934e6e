package sshfront

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Who is at the other end of a loopback TCP connection (issue 43, item 9).
//
// Over TCP the kernel gives the front door no SO_PEERCRED, and every
// local process shares the peer group 127.0.0.1 (it may bind any source
// address of 127.0.0.0/8 anyway): a process that opened connections
// faster than a client completed its handshake displaced that client's
// pending login. But on loopback the client's own socket is in the
// daemon's network namespace, and the kernel lists it with its owner in
// /proc/net/tcp (tcp6): the uid of the process that created it (its
// file system uid, which only a process with CAP_SETUID chooses),
// translated into the reader's user namespace. The entry whose local
// address is the peer's address and whose remote address is the
// listener's is the client's socket; there is one such socket while the
// connection lives (a 4-tuple names one connection).
//
// What is trusted, and why:
//   - Only entries with an inode: a socket some process still holds. A
//     socket its process closed (orphaned, FIN_WAIT, TIME_WAIT) is listed
//     with inode 0 and, in TIME_WAIT, uid 0 (the kernel keeps no owner):
//     its connection is ending, and its peer is left unknown rather than
//     taken for root.
//   - The table is read after the connections it names were accepted, so
//     each one's client socket was in it already, unless closed since.
//     Its 4-tuple could then be taken by a new connection (loopback
//     reuses TIME_WAIT tuples) whose owner the dying connection would be
//     counted as until it ends: a short window that needs the next
//     client port guessed, and that costs the owner of the new
//     connection one pending place at most.
//   - A process that connects for someone else (a proxy, a port forward)
//     is who connected, as with SO_PEERCRED on a Unix socket.
//
// The tables are read once for a batch of connections accepted together
// (Front.admitLoop): a flood of connections costs a read per batch, not
// one per connection.

// tcpConn is a TCP connection as its client's socket sees it: its local
// address (the peer's, to the front door) and its remote one (the
// listener's). Addresses are unmapped (IPv4 as such).
type tcpConn struct {
	client, server netip.AddrPort
}

// procNetTCP is where the kernel lists the network namespace's TCP
// sockets (Linux).
const procNetTCP = "/proc/net"

// maxProcNetLine bounds one line of /proc/net/tcp6 (about 170 bytes).
const maxProcNetLine = 4 << 10

// tcpOwners returns the uid that owns the client socket of each
// connection of want that it finds in the TCP socket tables under dir
// (/proc/net): tcp for IPv4 clients, then tcp6 for those not found (an
// IPv6 socket may connect to an IPv4 address, mapped). A connection not
// found is left out.
func tcpOwners(dir string, want []tcpConn) (map[tcpConn]uint32, error) {
	found := map[tcpConn]uint32{}
	missing := func(v4 bool) bool {
		for _, c := range want {
			if _, ok := found[c]; !ok && (!v4 || c.client.Addr().Is4()) {
				return true
			}
		}
		return false
	}
	for _, file := range []string{"tcp", "tcp6"} {
		if !missing(file == "tcp") {
			continue
		}
		f, err := os.Open(filepath.Join(dir, file))
		if err != nil {
			if file == "tcp6" && errors.Is(err, os.ErrNotExist) {
				continue // IPv6 is off
			}
			return found, fmt.Errorf("tcp socket owners: %w", err)
		}
		err = parseProcNetTCP(f, want, found)
		f.Close()
		if err != nil {
			return found, fmt.Errorf("tcp socket owners: %s: %w", file, err)
		}
	}
	return found, nil
}

// parseProcNetTCP reads a /proc/net/tcp or tcp6 table from r and adds to
// found the owner of each connection of want whose client socket it
// lists with an inode. It stops once every connection is found.
func parseProcNetTCP(r io.Reader, want []tcpConn, found map[tcpConn]uint32) error {
	wanted := make(map[tcpConn]bool, len(want))
	for _, c := range want {
		if _, ok := found[c]; !ok {
			wanted[c] = true
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 512), maxProcNetLine)
	for n := 1; len(wanted) > 0 && sc.Scan(); n++ {
		if n == 1 {
			continue // the header
		}
		f := strings.Fields(sc.Text())
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …
		if len(f) < 10 {
			return fmt.Errorf("line %d: %d fields, want at least 10", n, len(f))
		}
		local, err := parseProcAddr(f[1])
		if err != nil {
			return fmt.Errorf("line %d: local address: %w", n, err)
		}
		remote, err := parseProcAddr(f[2])
		if err != nil {
			return fmt.Errorf("line %d: remote address: %w", n, err)
		}
		c := tcpConn{client: local, server: remote}
		if !wanted[c] || f[9] == "0" {
			continue
		}
		uid, err := strconv.ParseUint(f[7], 10, 32)
		if err != nil {
			return fmt.Errorf("line %d: uid %q: %w", n, f[7], err)
		}
		found[c] = uint32(uid)
		delete(wanted, c)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return nil
}

// parseProcAddr parses an address of /proc/net/tcp ("0100007F:0016") or
// tcp6 (32 hex digits, then the port): the address is printed as 32-bit
// words in the host's byte order, the port as a number.
func parseProcAddr(s string) (netip.AddrPort, error) {
	h, p, ok := strings.Cut(s, ":")
	port, err := strconv.ParseUint(p, 16, 16)
	if !ok || err != nil || len(p) != 4 || (len(h) != 8 && len(h) != 32) {
		return netip.AddrPort{}, fmt.Errorf("%q is not ADDRESS:PORT in hex", s)
	}
	raw, err := hex.DecodeString(h)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%q: %w", s, err)
	}
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	a, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), nil
}
