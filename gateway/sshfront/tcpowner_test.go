package sshfront

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// procTCPHeader is the first line of /proc/net/tcp.
const procTCPHeader = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

// TestParseProcNetTCP: the owner of a connection's client socket is read
// from the entry whose local address is the client's and whose remote
// address is the listener's, and only from a socket a process holds (an
// inode): not from the listener's own end of the connection, not from a
// closed socket's TIME_WAIT entry (uid 0, inode 0), nor from another
// connection. Addresses are words in the host's byte order (this test's
// literals are little-endian's), IPv4 clients of an IPv6 socket mapped.
func TestParseProcNetTCP(t *testing.T) {
	if !littleEndian() {
		t.Skip("the literals below are a little-endian host's")
	}
	ap := netip.MustParseAddrPort
	listener := ap("127.0.0.1:2222")                                   // port 08AE
	alice := tcpConn{client: ap("127.0.0.1:40000"), server: listener}  // 9C40
	gone := tcpConn{client: ap("127.0.0.1:40001"), server: listener}   // 9C41
	bob := tcpConn{client: ap("127.0.0.2:40002"), server: listener}    // 9C42
	v6 := tcpConn{client: ap("[::1]:40003"), server: ap("[::1]:2222")} // 9C43
	mapped := tcpConn{client: ap("127.0.0.1:40004"), server: listener} // 9C44, an IPv6 socket
	absent := tcpConn{client: ap("127.0.0.1:40005"), server: listener} // 9C45, not listed
	other := tcpConn{client: ap("127.0.0.1:40000"), server: ap("127.0.0.1:2223")}

	tcp := procTCPHeader +
		// The listener, and the front door's end of alice's connection (vmgate, uid 997).
		"   0: 0100007F:08AE 00000000:0000 0A 00000000:00000000 00:00000000 00000000   997        0 1001 1 0 100 0 0 10 0\n" +
		"   1: 0100007F:08AE 0100007F:9C40 01 00000000:00000000 00:00000000 00000000   997        0 1002 1 0 20 4 30 10 -1\n" +
		// alice's client socket.
		"   2: 0100007F:9C40 0100007F:08AE 01 00000000:00000000 00:00000000 00000000  1000        0 1003 1 0 20 4 30 10 -1\n" +
		// A closed client: TIME_WAIT, no owner.
		"   3: 0100007F:9C41 0100007F:08AE 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0\n" +
		// bob, from another loopback address.
		"   4: 0200007F:9C42 0100007F:08AE 01 00000000:00000000 00:00000000 00000000  1001        0 1004 1 0 20 4 30 10 -1\n" +
		// alice's port to another listener.
		"   5: 0100007F:9C40 0100007F:08AF 01 00000000:00000000 00:00000000 00000000  1002        0 1005 1 0 20 4 30 10 -1\n"
	tcp6 := procTCPHeader +
		"   0: 00000000000000000000000001000000:9C43 00000000000000000000000001000000:08AE 01 00000000:00000000 00:00000000 00000000  1003        0 2001 1 0 20 4 30 10 -1\n" +
		"   1: 0000000000000000FFFF00000100007F:9C44 0000000000000000FFFF00000100007F:08AE 01 00000000:00000000 00:00000000 00000000  1004        0 2002 1 0 20 4 30 10 -1\n"

	dir := t.TempDir()
	for name, text := range map[string]string{"tcp": tcp, "tcp6": tcp6} {
		if err := os.WriteFile(dir+"/"+name, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := tcpOwners(dir, []tcpConn{alice, gone, bob, v6, mapped, absent})
	if err != nil {
		t.Fatal(err)
	}
	want := map[tcpConn]uint32{alice: 1000, bob: 1001, v6: 1003, mapped: 1004}
	if len(got) != len(want) {
		t.Errorf("found %v, want %v", got, want)
	}
	for c, uid := range want {
		if got[c] != uid {
			t.Errorf("%v: uid %d, want %d (found %v)", c, got[c], uid, got)
		}
	}
	got, err = tcpOwners(dir, []tcpConn{other})
	if err != nil || got[other] != 1002 {
		t.Errorf("another listener's connection from the same port: %v, %v", got, err)
	}

	for _, bad := range []string{
		"   0: 0100007F:9C40 0100007F:08AE 01\n", // cut short
		"   0: 0100007F9C40 0100007F:08AE 01 00000000:00000000 00:00000000 00000000  1000 0 1003 1 0 20 4 30 10 -1\n", // no port
		"   0: 0100007F:9C40 0100007F:08AE 01 00000000:00000000 00:00000000 00000000  -1 0 1003 1 0 20 4 30 10 -1\n",  // uid
		"   0: 0100007F:9C40 0100007F:08AE 01 00000000:00000000 00:00000000 00000000  1000 0 1003 " + strings.Repeat("x", 5000) + "\n",
	} {
		if err := parseProcNetTCP(strings.NewReader(procTCPHeader+bad), []tcpConn{alice}, map[tcpConn]uint32{}); err == nil {
			t.Errorf("%.60q: no error", bad)
		}
	}
	// A table without IPv6 (tcp6 missing) is no error.
	if err := os.Remove(dir + "/tcp6"); err != nil {
		t.Fatal(err)
	}
	if got, err := tcpOwners(dir, []tcpConn{alice, v6}); err != nil || got[alice] != 1000 {
		t.Errorf("without tcp6: %v, %v", got, err)
	}
}

func littleEndian() bool {
	a, err := parseProcAddr("0100007F:0000")
	return err == nil && a.Addr() == netip.MustParseAddr("127.0.0.1")
}

// TestTCPOwners_Self: in the kernel's own tables, a loopback connection
// this process makes is owned by this process's uid, over IPv4 and, where
// the host has it, IPv6.
func TestTCPOwners_Self(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if addr == "[::1]:0" {
				t.Logf("no IPv6 loopback: %v", err)
				continue
			}
			t.Fatal(err)
		}
		defer ln.Close()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		tc, ok := loopbackTCP(s)
		if !ok {
			t.Fatalf("%s: not a loopback connection: %v", addr, s.RemoteAddr())
		}
		got, err := tcpOwners(procNetTCP, []tcpConn{tc})
		if uid, found := got[tc]; err != nil || !found || uid != uint32(os.Getuid()) {
			t.Errorf("%s: owner %d (found %v, %v), want uid %d", addr, uid, found, err, os.Getuid())
		}
	}
}

// TestPeersOf_OwnerUnknown: a loopback TCP connection whose client socket
// the tables do not list (closed already), or all of them when the
// tables cannot be read, is grouped by its IP address, never by its
// address and port, which would make each connection a peer of its own;
// a listed one by its owner's uid, counted as Config.CallerOf says.
func TestPeersOf_OwnerUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var batch []net.Conn
	for range 2 {
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		batch = append(batch, s)
	}
	var logs strings.Builder
	f := &Front{warn: newBurstLog(slog.New(slog.NewTextHandler(&logs, nil)), time.Minute)}
	empty := t.TempDir()
	if err := os.WriteFile(empty+"/tcp", []byte(procTCPHeader), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{empty, t.TempDir() /* no tables at all */} {
		f.procNet = dir
		for i, id := range f.peersOf(batch) {
			if id.err != nil || id.p.group != "127.0.0.1" || id.p.hasUID || id.p.capped {
				t.Errorf("%s: connection %d: %+v, want the group 127.0.0.1 and no uid", dir, i, id)
			}
		}
	}
	if !strings.Contains(logs.String(), "grouped by IP address") {
		t.Errorf("tables that cannot be read should be logged:\n%s", logs.String())
	}
	f.procNet = procNetTCP
	f.cfg.CallerOf = func(uid uint32) (uint32, error) { return uid + 1, nil }
	for i, id := range f.peersOf(batch) {
		if want := fmt.Sprintf("uid %d", os.Getuid()+1); id.err != nil || id.p.group != want || id.p.ranAs != uint32(os.Getuid()) || id.p.capped {
			t.Errorf("connection %d: %+v, want the group %q, not capped (TCP)", i, id, want)
		}
	}
}
