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

func TestMaskAndFirstNIC(t *testing.T) {
	if m := maskOf(24); m != [4]byte{255, 255, 255, 0} {
		t.Errorf("maskOf(24) = %v", m)
	}
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
