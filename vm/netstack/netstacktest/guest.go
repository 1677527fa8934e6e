// Package netstacktest plays a VM for the tests of its host-side network
// (packages vm/netstack, vm/netproc): a second, real TCP/IP stack with the
// guest's address, wired to the network through QEMU's stream framing.
package netstacktest

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"github.com/vmgate/vmgate/guest/netconf"
	"github.com/vmgate/vmgate/internal/netwire"
)

// NIC is the guest stack's one NIC.
const NIC = 1

// Stack is a guest's TCP/IP stack on conn (QEMU's side of the network's
// socket): the guest's address, its gateway's route, frames as QEMU's
// stream netdev carries them. It is closed at the end of the test.
func Stack(t testing.TB, conn net.Conn) *stack.Stack {
	t.Helper()
	st := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	link := channel.New(512, 1514, tcpip.LinkAddress("\x52\x54\x00\x12\x34\x56"))
	if err := st.CreateNIC(NIC, ethernet.New(link)); err != nil {
		t.Fatal(err)
	}
	addr := tcpip.AddrFromSlice(netconf.Guest.Addr().AsSlice()).WithPrefix()
	addr.PrefixLen = netconf.Guest.Bits()
	if err := st.AddProtocolAddress(NIC, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: addr}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	m := netconf.Guest.Masked()
	sub, _ := tcpip.NewSubnet(tcpip.AddrFromSlice(m.Addr().AsSlice()), tcpip.MaskFromBytes(net.CIDRMask(m.Bits(), 32)))
	st.SetRouteTable([]tcpip.Route{
		{Destination: sub, NIC: NIC},
		{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFromSlice(netconf.Gateway.AsSlice()), NIC: NIC},
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		buf := make([]byte, netwire.MaxFrame)
		for {
			f, err := netwire.ReadFrame(conn, buf)
			if err != nil {
				return
			}
			pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(append([]byte(nil), f...))})
			link.InjectInbound(0, pkt)
			pkt.DecRef()
		}
	}()
	go func() {
		for {
			pkt := link.ReadContext(ctx)
			if pkt == nil {
				return
			}
			v := pkt.ToView()
			_, err := conn.Write(netwire.AppendFrame(nil, v.AsSlice()))
			v.Release()
			pkt.DecRef()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); st.Close() })
	return st
}

// Listen listens on port of the guest's address.
func Listen(t testing.TB, st *stack.Stack, port uint16) net.Listener {
	t.Helper()
	ln, err := gonet.ListenTCP(st, tcpip.FullAddress{NIC: NIC, Addr: tcpip.AddrFromSlice(netconf.Guest.Addr().AsSlice()), Port: port}, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// Addr is a's address in the guest stack's terms.
func Addr(a netip.Addr) tcpip.Address { return tcpip.AddrFromSlice(a.AsSlice()) }

// Echo serves one connection on ln, in the background: it sends back what
// it reads, and the returned channel gets the client's address.
func Echo(ln net.Listener) <-chan string {
	from := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		from <- c.RemoteAddr().String()
		_, _ = io.Copy(c, c)
	}()
	return from
}

// Ping writes "ping" on c and fails the test unless it reads it back (from
// an Echo) within 10 s.
func Ping(t testing.TB, c net.Conn) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "ping"); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo: %q %v", buf, err)
	}
	_ = c.SetDeadline(time.Time{})
}
