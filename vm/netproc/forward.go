package netproc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/relay"
	"github.com/vmgate/vmgate/vm/netstack"
)

// Connections into the guest (published ports). The daemon makes a
// socket pair per connection and passes one end with a Dial message; the
// netstack dials the guest's port from the gateway's address, writes one
// status byte and relays. The netstack never sees the host client's
// socket, its address or its credentials, and the daemon counts the
// bytes itself.
const (
	// guestDialTimeout bounds the netstack's handshake with the guest.
	guestDialTimeout = 10 * time.Second
	// statusWait bounds the daemon's wait for the status byte: the
	// handshake's bound and a margin.
	statusWait = guestDialTimeout + 2*time.Second
	// maxDials bounds the connections into the guest one netstack
	// relays at once. A VM's published ports together may ask for more
	// (up to 16 ports of sessions.publish_max_conns each): the netstack
	// answers a dial beyond it dialBusy, and the daemon refuses that one
	// connection.
	maxDials = 256
)

// DialGuest opens a connection into port of the guest through the
// netstack (see netstack.Network.DialGuest). ctx bounds the wait for the
// netstack's answer, which comes within statusWait in any case. The error
// wraps netstack.ErrGuestRefused or netstack.ErrGuestUnreachable when the
// guest refused or did not answer.
func (p *Proc) DialGuest(ctx context.Context, port uint16) (net.Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dial guest: %w", os.NewSyscallError("socketpair", err))
	}
	mine, theirs := os.NewFile(uintptr(fds[0]), "guest-dial"), os.NewFile(uintptr(fds[1]), "guest-dial")
	defer theirs.Close()
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		return nil, fmt.Errorf("dial guest: %w", err)
	}
	b, err := json.Marshal(toChild{Dial: &wireDial{Port: port}})
	if err == nil {
		err = p.write(b, unix.UnixRights(int(theirs.Fd())))
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("dial guest: send to the netstack: %w", err)
	}
	theirs.Close() // the netstack holds its end now
	_ = c.SetReadDeadline(time.Now().Add(statusWait))
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	var st [1]byte
	_, err = io.ReadFull(c, st[:])
	stop()
	if err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dial guest port %d: %w", port, ctx.Err())
		}
		return nil, fmt.Errorf("dial guest port %d: no answer from the netstack: %w", port, err)
	}
	_ = c.SetReadDeadline(time.Time{})
	if err := dialStatusError(st[0]); err != nil {
		c.Close()
		return nil, fmt.Errorf("dial guest port %d: %w", port, err)
	}
	return c, nil
}

// dialStatusError is what a dial status byte says: nil for dialOK.
func dialStatusError(b byte) error {
	switch b {
	case dialOK:
		return nil
	case dialRefused:
		return netstack.ErrGuestRefused
	case dialUnreachable:
		return netstack.ErrGuestUnreachable
	case dialBusy:
		return fmt.Errorf("the netstack carries %d connections into the guest already", maxDials)
	case dialFailed:
		return errors.New("the netstack could not dial (its network is closing)")
	}
	return fmt.Errorf("the netstack answered status %d, which is none", b)
}

// dialStatus is the status byte of a dial's outcome.
func dialStatus(err error) byte {
	switch {
	case err == nil:
		return dialOK
	case errors.Is(err, netstack.ErrGuestRefused):
		return dialRefused
	case errors.Is(err, netstack.ErrGuestUnreachable):
		return dialUnreachable
	}
	return dialFailed
}

// dialer is the netstack's side of the dials into its guest.
type dialer struct {
	n      *netstack.Network
	log    *slog.Logger
	active atomic.Int32
}

// serve dials port of the guest for the daemon's socket pair end pair
// (which it takes), answers the status and relays, in a goroutine of its
// own.
func (d *dialer) serve(port uint16, pair *os.File) {
	c, err := net.FileConn(pair)
	pair.Close()
	if err != nil {
		d.log.Warn("dial into the guest: the daemon's socket", "err", err)
		return
	}
	go func() {
		defer c.Close()
		if d.active.Add(1) > maxDials {
			d.active.Add(-1)
			_, _ = c.Write([]byte{dialBusy})
			return
		}
		defer d.active.Add(-1)
		ctx, cancel := context.WithTimeout(context.Background(), guestDialTimeout)
		g, err := d.n.DialGuest(ctx, port)
		cancel()
		if _, werr := c.Write([]byte{dialStatus(err)}); err != nil || werr != nil {
			if g != nil {
				g.Close()
			}
			return
		}
		defer g.Close()
		relay.Conns(c, g)
	}()
}
