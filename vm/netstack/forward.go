package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Why a connection into the guest was not made (DialGuest).
var (
	// ErrGuestRefused: the guest answered with a reset; nothing listens
	// on the port (or its firewall rejects).
	ErrGuestRefused = errors.New("the guest refused the connection (nothing listens on the port)")
	// ErrGuestUnreachable: no answer in time, or no route to the guest
	// (it has no address yet, or drops the connection).
	ErrGuestUnreachable = errors.New("the guest did not answer")
)

// DialGuest opens a TCP connection from the gateway's address to port of
// the guest: a host client's connection into a published port (vmgate's
// daemon passes it on; it never opens a guest socket itself). It is not
// subject to the egress policy, and does not count against its limits:
// the daemon bounds the connections of each published port. ctx bounds
// the handshake.
//
// The error wraps ErrGuestRefused or ErrGuestUnreachable when the guest
// refused or did not answer.
func (n *Network) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	if port == 0 {
		return nil, errors.New("dial guest: port 0")
	}
	var wq waiter.Queue
	ep, terr := n.st.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		return nil, fmt.Errorf("dial guest: %s", terr)
	}
	entry, ready := waiter.NewChannelEntry(waiter.WritableEvents)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	// From the gateway, as QEMU's user network forwards host ports.
	if terr := ep.Bind(tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(GatewayAddr.AsSlice())}); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("dial guest: bind: %s", terr)
	}
	terr = ep.Connect(tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(GuestAddr.AsSlice()), Port: port})
	if _, ok := terr.(*tcpip.ErrConnectStarted); ok {
		select {
		case <-ready:
			terr = ep.LastError()
		case <-ctx.Done():
			ep.Close()
			return nil, fmt.Errorf("dial guest port %d: %w (%v)", port, ErrGuestUnreachable, ctx.Err())
		case <-n.ctx.Done():
			ep.Close()
			return nil, fmt.Errorf("dial guest port %d: the network is closed", port)
		}
	}
	if terr != nil {
		ep.Close()
		return nil, fmt.Errorf("dial guest port %d: %w", port, guestDialError(terr))
	}
	return gonet.NewTCPConn(&wq, ep), nil
}

// guestDialError says what a failed handshake with the guest means.
func guestDialError(terr tcpip.Error) error {
	switch terr.(type) {
	case *tcpip.ErrConnectionRefused, *tcpip.ErrConnectionReset:
		return ErrGuestRefused
	case *tcpip.ErrTimeout, *tcpip.ErrHostUnreachable, *tcpip.ErrNetworkUnreachable, *tcpip.ErrAborted:
		return fmt.Errorf("%w (%s)", ErrGuestUnreachable, terr)
	}
	return errors.New(terr.String())
}
