package netstack

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// A minimal DHCPv4 server (RFC 2131) for one client: whatever the guest
// asks, it is offered GuestAddr with the gateway and DNS server above. The
// guest is untrusted: the parser reads only what it needs and bounds
// every field.

const (
	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpDecline  = 4
	dhcpAck      = 5
	dhcpNak      = 6
	dhcpRelease  = 7
	dhcpInform   = 8

	dhcpLease = 24 * 3600 // seconds; the VM is gone long before
)

var dhcpMagic = [4]byte{99, 130, 83, 99}

// dhcpRequestMsg is what the server uses of a client message.
type dhcpRequestMsg struct {
	xid       [4]byte
	chaddr    [16]byte
	flags     uint16
	msgType   byte
	requested netip.Addr // option 50, if any
}

func parseDHCP(b []byte) (dhcpRequestMsg, error) {
	var m dhcpRequestMsg
	if len(b) < 240 || b[0] != 1 || b[1] != 1 || b[2] != 6 {
		return m, errors.New("dhcp: not an Ethernet BOOTREQUEST")
	}
	if [4]byte(b[236:240]) != dhcpMagic {
		return m, errors.New("dhcp: no magic cookie")
	}
	copy(m.xid[:], b[4:8])
	m.flags = binary.BigEndian.Uint16(b[10:12])
	copy(m.chaddr[:], b[28:44])
	opts := b[240:]
	for i := 0; i < len(opts); {
		code := opts[i]
		if code == 255 {
			break
		}
		if code == 0 {
			i++
			continue
		}
		if i+1 >= len(opts) || i+2+int(opts[i+1]) > len(opts) {
			return m, errors.New("dhcp: truncated option")
		}
		val := opts[i+2 : i+2+int(opts[i+1])]
		switch code {
		case 53:
			if len(val) == 1 {
				m.msgType = val[0]
			}
		case 50:
			if len(val) == 4 {
				m.requested = netip.AddrFrom4([4]byte(val))
			}
		}
		i += 2 + len(val)
	}
	if m.msgType == 0 {
		return m, errors.New("dhcp: no message type")
	}
	return m, nil
}

// dhcpReply answers a client message; nil means no answer (RELEASE,
// DECLINE, unknown types).
func dhcpReply(m dhcpRequestMsg) []byte {
	var typ byte
	switch m.msgType {
	case dhcpDiscover:
		typ = dhcpOffer
	case dhcpRequest:
		typ = dhcpAck
		if m.requested.IsValid() && m.requested != GuestAddr {
			typ = dhcpNak
		}
	case dhcpInform:
		typ = dhcpAck
	default:
		return nil
	}
	b := make([]byte, 240, 300)
	b[0], b[1], b[2] = 2, 1, 6 // BOOTREPLY, Ethernet, hlen 6
	copy(b[4:8], m.xid[:])
	binary.BigEndian.PutUint16(b[10:12], m.flags)
	if typ != dhcpNak && m.msgType != dhcpInform {
		copy(b[16:20], GuestAddr.AsSlice()) // yiaddr
	}
	copy(b[20:24], GatewayAddr.AsSlice()) // siaddr
	copy(b[28:44], m.chaddr[:])
	copy(b[236:240], dhcpMagic[:])
	opt := func(code byte, val ...byte) { b = append(append(b, code, byte(len(val))), val...) }
	opt(53, typ)
	opt(54, GatewayAddr.AsSlice()...) // server identifier
	if typ != dhcpNak {
		lease := binary.BigEndian.AppendUint32(nil, dhcpLease)
		opt(51, lease...)
		opt(1, 255, 255, 255, 0)         // subnet mask
		opt(3, GatewayAddr.AsSlice()...) // router
		opt(6, DNSAddr.AsSlice()...)     // DNS server
		opt(26, 0x05, 0xdc)              // MTU 1500
	}
	return append(b, 255)
}
