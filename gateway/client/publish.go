package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/gateway/wire"
)

// PublishSpec is the host side and the guest port of a published session
// port, as vm-exec --publish takes it: [HOST_ADDR:]HOST_PORT:GUEST_PORT,
// or UNIX_PATH:GUEST_PORT.
type PublishSpec struct {
	// Addr is the TCP address to listen on (port 0: any free port);
	// invalid when Unix is set.
	Addr netip.AddrPort
	// Unix is the path of a Unix socket to listen on.
	Unix      string
	GuestPort uint16
}

// maxUnixPath is what sun_path holds, its NUL excluded.
const maxUnixPath = 107

// ParsePublish parses a --publish value (pure; fuzzed). The host address
// defaults to 127.0.0.1; "localhost" is 127.0.0.1; an IPv6 address is
// written in brackets ([::1]:8080:8000). A host side with a "/" is a Unix
// socket's path (./app.sock for one in the current directory).
func ParsePublish(s string) (PublishSpec, error) {
	bad := func(format string, args ...any) (PublishSpec, error) {
		return PublishSpec{}, fmt.Errorf("--publish %q: "+format+" (want [HOST_ADDR:]HOST_PORT:GUEST_PORT or SOCKET_PATH:GUEST_PORT)", append([]any{s}, args...)...)
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return bad("no guest port")
	}
	host, guest := s[:i], s[i+1:]
	gp, err := parsePort(guest)
	if err != nil || gp == 0 {
		return bad("guest port %q: must be 1 to 65535", guest)
	}
	spec := PublishSpec{GuestPort: gp}
	switch {
	case strings.Contains(host, "/"):
		if err := checkUnixPath(host); err != nil {
			return bad("%v", err)
		}
		spec.Unix = host
		return spec, nil
	case host == "":
		return bad("no host port")
	}
	addr, port := "127.0.0.1", host
	if _, err := netip.ParseAddr(host); err == nil || host == "localhost" {
		return bad("%q is a host address without a host port (ADDR:PORT:GUESTPORT)", host)
	}
	if j := strings.LastIndexByte(host, ':'); j >= 0 {
		addr, port = host[:j], host[j+1:]
		switch {
		case strings.HasPrefix(addr, "[") && strings.HasSuffix(addr, "]"):
			addr = addr[1 : len(addr)-1]
			if a, err := netip.ParseAddr(addr); err != nil || !a.Is6() || a.Zone() != "" {
				return bad("%q is not an IPv6 address", addr)
			}
		case strings.Contains(addr, ":"):
			return bad("an IPv6 address goes in brackets: [%s]", addr)
		case addr == "localhost":
			addr = "127.0.0.1"
		}
	}
	a, err := netip.ParseAddr(addr)
	if err != nil || a.Zone() != "" {
		return bad("host address %q is not an IP address (or localhost)", addr)
	}
	hp, err := parsePort(port)
	if err != nil {
		return bad("host port %q: must be 0 (any free port) to 65535", port)
	}
	spec.Addr = netip.AddrPortFrom(a, hp)
	return spec, nil
}

// parsePort parses a decimal port, 0 to 65535, digits only.
func parsePort(s string) (uint16, error) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" || len(s) > 5 {
		return 0, errors.New("not a port")
	}
	n, err := strconv.ParseUint(s, 10, 16)
	return uint16(n), err
}

// checkUnixPath checks the path of a Unix socket to publish on.
func checkUnixPath(p string) error {
	switch {
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("a NUL in the socket path")
	case strings.HasSuffix(p, "/"):
		return errors.New("the socket path names a directory")
	case len(p) > maxUnixPath:
		return fmt.Errorf("the socket path is over %d bytes", maxUnixPath)
	}
	return nil
}

// String is the spec as --publish takes it.
func (s PublishSpec) String() string {
	if s.Unix != "" {
		return fmt.Sprintf("%s:%d", s.Unix, s.GuestPort)
	}
	return fmt.Sprintf("%s:%d", s.Addr, s.GuestPort)
}

// HostListener is the listening socket of a published port, made by the
// caller (Listen), whose permissions it has: a Unix socket is 0600, only
// its owner (and root) may connect.
type HostListener struct {
	ln   net.Listener
	path string // a Unix socket's file, removed by Close if still its own
	ino  uint64
}

// Listen makes the listening socket of s: a TCP listener, or a Unix
// socket at s.Unix made absolute. A socket file that nothing listens on
// any more (a forward that was killed) is replaced; anything else there
// is an error. A busy address is an error that names it.
func (s PublishSpec) Listen() (*HostListener, error) {
	if s.Unix == "" {
		ln, err := net.Listen("tcp", s.Addr.String())
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, fmt.Errorf("publish on %s: the address is in use on this host", s.Addr)
			}
			return nil, fmt.Errorf("publish on %s: %w", s.Addr, err)
		}
		return &HostListener{ln: ln}, nil
	}
	path, err := filepath.Abs(s.Unix)
	if err == nil {
		err = checkUnixPath(path)
	}
	if err != nil {
		return nil, fmt.Errorf("publish on %s: %w", s.Unix, err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	// 0600 from its creation: no other user connects in between.
	old := unix.Umask(0o177)
	ln, err := net.Listen("unix", path)
	unix.Umask(old)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("publish on %s: the socket is in use", path)
		}
		return nil, fmt.Errorf("publish on %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false) // Close removes it, if still its own
	h := &HostListener{ln: ln, path: path}
	var st unix.Stat_t
	if unix.Lstat(path, &st) == nil {
		h.ino = st.Ino
	}
	return h, nil
}

// removeStale removes a Unix socket at path that nothing listens on.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("publish on %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("publish on %s: a file that is not a socket is there", path)
	}
	c, err := net.Dial("unix", path)
	if err == nil {
		c.Close()
		return fmt.Errorf("publish on %s: the socket is in use", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("publish on %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("publish on %s: remove the stale socket: %w", path, err)
	}
	return nil
}

// Addr is where the listener listens: a TCP address (its port chosen,
// for port 0) or a Unix socket's path.
func (h *HostListener) Addr() string {
	if h.path != "" {
		return h.path
	}
	return h.ln.Addr().String()
}

// Close closes the listener and removes its socket file, unless another
// one has replaced it.
func (h *HostListener) Close() error {
	err := h.ln.Close()
	if errors.Is(err, net.ErrClosed) {
		err = nil // passed to the daemon (Publish)
	}
	if h.path != "" {
		var st unix.Stat_t
		if unix.Lstat(h.path, &st) == nil && st.Ino == h.ino && st.Mode&unix.S_IFMT == unix.S_IFSOCK {
			if rerr := os.Remove(h.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				err = errors.Join(err, rerr)
			}
		}
	}
	return err
}

// file is a duplicate of the listening socket's descriptor.
func (h *HostListener) file() (*os.File, error) {
	switch l := h.ln.(type) {
	case *net.TCPListener:
		return l.File()
	case *net.UnixListener:
		return l.File()
	}
	return nil, errors.New("not a TCP or Unix listener")
}

// Publish forwards connections to h into port guestPort of the caller's
// session: the daemon takes the listening socket (h stops accepting
// itself; its Unix socket file stays until h.Close), ready is called
// once it forwards, and Publish returns when the forward ends: the
// session ended (the last wire.Published says why; the error is nil),
// ctx ended (closing the connection ends the forward), or the daemon
// refused (*APIError, or *ExecFailedError after the upgrade).
func (c *Client) Publish(ctx context.Context, session string, guestPort int, h *HostListener, ready func(wire.Published)) (*wire.Published, error) {
	body, err := json.Marshal(wire.PublishRequest{GuestPort: guestPort})
	if err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	conn, br, done, err := c.upgrade(ctx, "publish", "/v1/sessions/"+url.PathEscape(session)+"/publish", wire.PublishUpgrade, body)
	if err != nil {
		return nil, err
	}
	defer done()
	if err := sendListener(conn, h); err != nil {
		return nil, ctxOr(ctx, err)
	}
	for {
		typ, p, err := wire.ReadFrame(br)
		if err != nil {
			return nil, ctxOr(ctx, &UnreachableError{Socket: c.Socket, Err: fmt.Errorf("publish: the daemon went away: %w", err)})
		}
		switch typ {
		case wire.FrameError:
			var e wire.Error
			if err := json.Unmarshal(p, &e); err != nil {
				return nil, fmt.Errorf("publish: bad error frame: %w", err)
			}
			return nil, &ExecFailedError{Body: e}
		case wire.FrameResult:
			var pub wire.Published
			if err := json.Unmarshal(p, &pub); err != nil {
				return nil, fmt.Errorf("publish: bad frame: %w", err)
			}
			if pub.State == wire.PublishEnded {
				return &pub, nil
			}
			if ready != nil {
				ready(pub)
			}
		default:
			return nil, fmt.Errorf("publish: unexpected frame %q", typ)
		}
	}
}

// sendListener passes h's listening socket to the daemon and stops
// accepting on it here.
func sendListener(conn net.Conn, h *HostListener) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return errors.New("publish: the daemon's socket is not a Unix socket")
	}
	f, err := h.file()
	if err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	defer f.Close()
	if _, _, err := uc.WriteMsgUnix([]byte{0}, unix.UnixRights(int(f.Fd())), nil); err != nil {
		return fmt.Errorf("publish: pass the listening socket: %w", err)
	}
	// The daemon holds the socket now: this process neither accepts on
	// it nor keeps it open (the end of the forward closes the port).
	_ = h.ln.Close()
	return nil
}
