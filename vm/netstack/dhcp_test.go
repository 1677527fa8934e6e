package netstack

import (
	"net/netip"
	"testing"
)

func dhcpPacket(typ byte, requested ...byte) []byte {
	b := make([]byte, 240)
	b[0], b[1], b[2] = 1, 1, 6
	copy(b[4:8], []byte{1, 2, 3, 4})
	copy(b[28:34], []byte{0x52, 0x54, 0, 0x12, 0x34, 0x56})
	copy(b[236:240], dhcpMagic[:])
	b = append(b, 53, 1, typ)
	if len(requested) == 4 {
		b = append(b, 50, 4)
		b = append(b, requested...)
	}
	return append(b, 0, 0, 255)
}

func TestDHCP(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []byte
		want byte // reply type, 0: none
	}{
		{"discover", dhcpPacket(dhcpDiscover), dhcpOffer},
		{"request", dhcpPacket(dhcpRequest, 10, 0, 2, 15), dhcpAck},
		{"request other address", dhcpPacket(dhcpRequest, 10, 0, 2, 99), dhcpNak},
		{"release", dhcpPacket(dhcpRelease), 0},
	} {
		m, err := parseDHCP(c.in)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		r := dhcpReply(m)
		if c.want == 0 {
			if r != nil {
				t.Errorf("%s: answered", c.name)
			}
			continue
		}
		rm, err := parseReply(r)
		if err != nil || rm.msgType != c.want || rm.xid != m.xid || rm.chaddr != m.chaddr {
			t.Errorf("%s: reply %+v %v", c.name, rm, err)
		}
		if c.want != dhcpNak && netip.AddrFrom4([4]byte(r[16:20])) != GuestAddr {
			t.Errorf("%s: yiaddr %v", c.name, r[16:20])
		}
	}
	for name, bad := range map[string][]byte{
		"short":     make([]byte, 100),
		"no cookie": make([]byte, 300),
		"truncated": append(dhcpPacket(dhcpDiscover)[:240], 53, 5, 1),
		"no type":   append(dhcpPacket(dhcpDiscover)[:240], 255),
		"bootreply": append([]byte{2}, dhcpPacket(dhcpDiscover)[1:]...),
	} {
		if _, err := parseDHCP(bad); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

// parseReply reads a server reply with the client parser (op flipped).
func parseReply(b []byte) (dhcpRequestMsg, error) {
	c := append([]byte(nil), b...)
	c[0] = 1
	return parseDHCP(c)
}

func FuzzDHCP(f *testing.F) {
	f.Add(dhcpPacket(dhcpDiscover))
	f.Add(dhcpPacket(dhcpRequest, 10, 0, 2, 15))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseDHCP(b)
		if err != nil {
			return
		}
		if r := dhcpReply(m); r != nil && len(r) < 240 {
			t.Fatal("short reply")
		}
	})
}
