package boot

import (
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRouteMessage(t *testing.T) {
	m := routeMessage(2, netip.MustParseAddr("10.0.2.2"))
	if got := binary.NativeEndian.Uint32(m); int(got) != len(m) || len(m) != unix.SizeofNlMsghdr+unix.SizeofRtMsg+16 {
		t.Fatalf("length %d in a message of %d bytes", got, len(m))
	}
	if typ := binary.NativeEndian.Uint16(m[4:]); typ != unix.RTM_NEWROUTE {
		t.Errorf("type %d", typ)
	}
	rt := m[unix.SizeofNlMsghdr:]
	if rt[0] != unix.AF_INET || rt[1] != 0 || rt[4] != unix.RT_TABLE_MAIN || rt[7] != unix.RTN_UNICAST {
		t.Errorf("rtmsg % x", rt[:unix.SizeofRtMsg])
	}
	attrs := rt[unix.SizeofRtMsg:]
	if binary.NativeEndian.Uint16(attrs[2:]) != unix.RTA_GATEWAY || string(attrs[4:8]) != "\x0a\x00\x02\x02" {
		t.Errorf("gateway attribute % x", attrs[:8])
	}
	if binary.NativeEndian.Uint16(attrs[10:]) != unix.RTA_OIF || binary.NativeEndian.Uint32(attrs[12:]) != 2 {
		t.Errorf("interface attribute % x", attrs[8:])
	}
}

// TestAddrMessage: the address request names the interface by index,
// with the prefix's length and the address as local and peer.
func TestAddrMessage(t *testing.T) {
	m := addrMessage(3, netip.MustParsePrefix("10.0.2.15/24"))
	if got := binary.NativeEndian.Uint32(m); int(got) != len(m) || len(m) != unix.SizeofNlMsghdr+unix.SizeofIfAddrmsg+16 {
		t.Fatalf("length %d in a message of %d bytes", got, len(m))
	}
	if typ, fl := binary.NativeEndian.Uint16(m[4:]), binary.NativeEndian.Uint16(m[6:]); typ != unix.RTM_NEWADDR || fl&unix.NLM_F_ACK == 0 || fl&unix.NLM_F_CREATE == 0 {
		t.Errorf("type %d, flags %#x", typ, fl)
	}
	ifa := m[unix.SizeofNlMsghdr:]
	if ifa[0] != unix.AF_INET || ifa[1] != 24 || ifa[3] != unix.RT_SCOPE_UNIVERSE || binary.NativeEndian.Uint32(ifa[4:]) != 3 {
		t.Errorf("ifaddrmsg % x", ifa[:unix.SizeofIfAddrmsg])
	}
	attrs := ifa[unix.SizeofIfAddrmsg:]
	for i, typ := range []uint16{unix.IFA_LOCAL, unix.IFA_ADDRESS} {
		a := attrs[8*i:]
		if binary.NativeEndian.Uint16(a) != 8 || binary.NativeEndian.Uint16(a[2:]) != typ || string(a[4:8]) != "\x0a\x00\x02\x0f" {
			t.Errorf("attribute %d: % x", i, a[:8])
		}
	}
}

// TestLinkUpMessage: the link request sets IFF_UP, and only it, on the
// interface of that index.
func TestLinkUpMessage(t *testing.T) {
	m := linkUpMessage(2)
	if got := binary.NativeEndian.Uint32(m); int(got) != len(m) || len(m) != unix.SizeofNlMsghdr+unix.SizeofIfInfomsg {
		t.Fatalf("length %d in a message of %d bytes", got, len(m))
	}
	if typ := binary.NativeEndian.Uint16(m[4:]); typ != unix.RTM_NEWLINK {
		t.Errorf("type %d", typ)
	}
	ifi := m[unix.SizeofNlMsghdr:]
	if index, flags, change := binary.NativeEndian.Uint32(ifi[4:]), binary.NativeEndian.Uint32(ifi[8:]), binary.NativeEndian.Uint32(ifi[12:]); index != 2 || flags != unix.IFF_UP || change != unix.IFF_UP {
		t.Errorf("ifinfomsg: index %d, flags %#x, change %#x", index, flags, change)
	}
}

func TestFirstNIC(t *testing.T) {
	d := t.TempDir()
	if firstNIC(d) != "" {
		t.Error("a NIC in an empty directory")
	}
	for _, n := range []string{"lo", "eth0"} {
		if err := os.Mkdir(filepath.Join(d, n), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if n := firstNIC(d); n != "eth0" {
		t.Errorf("firstNIC = %q", n)
	}
}
