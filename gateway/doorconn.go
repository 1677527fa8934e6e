package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/policy"
)

// doorListener hands the local API's HTTP server the connections a front
// door opens in-process (Server.dialAs). Each is one end of a Unix socket
// pair that carries the door's caller, so a door's request takes the very
// path a local caller's does (decision, audit, limits, sessions), with
// the identity the door established (a key) instead of SO_PEERCRED's.
type doorListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newDoorListener() *doorListener {
	return &doorListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *doorListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *doorListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *doorListener) Addr() net.Addr { return doorAddr{} }

type doorAddr struct{}

func (doorAddr) Network() string { return "unix" }
func (doorAddr) String() string  { return "@front-door" }

// dialAs opens a connection to the local API on which every request is
// id's. It fails once the daemon stops serving.
func (s *Server) dialAs(ctx context.Context, id policy.Identity) (net.Conn, error) {
	if id.Local() {
		// Local callers are identified by the kernel, never by a door.
		return nil, errors.New("front door: a door's caller must be a key")
	}
	ours, theirs, err := unixPair()
	if err != nil {
		return nil, fmt.Errorf("front door: %w", err)
	}
	ic := &identConn{UnixConn: theirs, id: id, release: func() {}}
	select {
	case s.door.conns <- ic:
		return ours, nil
	case <-s.door.done:
		err = errors.New("vmgated is stopping")
	case <-ctx.Done():
		err = ctx.Err()
	}
	_ = ours.Close()
	_ = theirs.Close()
	return nil, err
}

// unixPair returns the two ends of a connected Unix stream socket pair.
func unixPair() (*net.UnixConn, *net.UnixConn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "front-door")
		c, err := net.FileConn(f)
		_ = f.Close()
		if err != nil {
			if i == 1 {
				_ = conns[0].Close()
			} else {
				_ = unix.Close(fds[1])
			}
			return nil, nil, fmt.Errorf("socketpair: %w", err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	return conns[0], conns[1], nil
}
