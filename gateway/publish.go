package gateway

// Publishing a session's port on the host (vm-exec --publish): the
// caller makes the listening socket (as itself, in its own network
// namespace and directories: the daemon binds nothing a caller names, and
// under systemd it has no network of its own) and passes it on the
// publish request's upgraded connection. The daemon reads the socket's
// address from the kernel, asks the policy (policy.DecidePublish),
// accepts on it and carries each connection into the guest through the
// VM's netstack (netproc.Proc.DialGuest): it opens no guest socket
// itself. The forward ends with the session (its end, its lifetime, its
// VM's death), with the daemon, or when the publisher closes the
// connection; across a pause it stays, refusing connections until the
// session is resumed (forward.go).

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
)

// handlePublish publishes a port of the caller's session on the
// listening socket the client passes after the upgrade, and holds the
// forward until it ends (see the package's publish.go doc).
func (s *Server) handlePublish(w http.ResponseWriter, r *http.Request) {
	ss := s.callerSession(w, r)
	if ss == nil {
		return
	}
	id, _ := identityFrom(r.Context())
	if !strings.EqualFold(r.Header.Get("Upgrade"), wire.PublishUpgrade) {
		refuse(w, wire.KindBadRequest, "publish needs the header Upgrade: "+wire.PublishUpgrade)
		return
	}
	var req wire.PublishRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, 4096))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		refuse(w, wire.KindBadRequest, "publish: "+err.Error())
		return
	}
	if req.GuestPort < 1 || req.GuestPort > 65535 {
		refuse(w, wire.KindBadRequest, fmt.Sprintf("publish: guest port %d: must be 1 to 65535", req.GuestPort))
		return
	}
	l, rerr := s.enter(r.Context())
	if rerr != nil {
		refuse(w, rerr.Kind, rerr.Msg)
		return
	}
	defer l.end()
	q := newSessionRequest(id, ss, "")
	conn, br, err := upgrade(w, wire.PublishUpgrade, q.reqID)
	if err != nil {
		return
	}
	defer conn.Close()
	p, rerr := s.sessions.publish(conn, br, ss, q, req.GuestPort)
	if rerr != nil {
		rerr.RequestID = q.reqID
		_ = conn.SetWriteDeadline(time.Now().Add(writeStall))
		_ = wire.WriteJSONFrame(conn, wire.FrameError, rerr.Wire())
		return
	}
	s.sessions.holdPublication(conn, br, p, l)
}

// publish takes the client's listening socket from conn, decides q (a
// publication of ss's port), and starts forwarding; the publication is
// the session's until it stops.
func (x *sessions) publish(conn net.Conn, br *bufio.Reader, ss *session, q *sessionRequest, port int) (*publication, *RequestError) {
	bad := func(format string, args ...any) *RequestError {
		return &RequestError{Kind: ErrBadRequest, Msg: "publish: " + fmt.Sprintf(format, args...)}
	}
	if br.Buffered() > 0 {
		return nil, bad("bytes before the listening socket")
	}
	f, err := takeListener(conn)
	if err != nil {
		return nil, bad("%v", err)
	}
	defer dropPassedFile(f)
	host, err := listenerAddr(f)
	if err != nil {
		return nil, bad("%v", err)
	}
	q.what = fmt.Sprintf("publish %s -> guest port %d", host, port)
	q.policy = x.core.policyNow()
	q.verdict = q.policy.DecidePublish(q.id, policy.PublishRequest{Session: ss.Name, GuestPort: port, Host: host, Image: ss.image()})
	if err := x.rec.decision(&q.request, q.decisionRecord()); err != nil {
		return nil, &RequestError{Kind: ErrAuditUnavailable, Msg: "refusing to publish unaudited: " + err.Error()}
	}
	v := q.verdict
	if !v.Allowed {
		return nil, &RequestError{Kind: ErrDenied, Msg: v.Reason, Profile: v.Profile, Rule: v.Rule}
	}
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, bad("%v", err)
	}
	p := newPublication(x, ss, q.id, q.reqID, v, host, uint16(port), ln)
	if rerr := ss.addPublication(p); rerr != nil {
		ln.Close()
		return nil, rerr
	}
	if !host.Addr.Addr().Unmap().IsLoopback() && host.Unix == "" {
		x.log.Warn("RELAXATION: a session port is published on a non-loopback address (sessions.publish_any_address): other machines may reach the guest's service",
			"session", ss.Name, "host", host.String(), "guest_port", port, "uid", q.id.UID)
	}
	return p, nil
}

// holdPublication forwards until the publication stops: the session
// ends, the daemon stops, the publisher goes away (closes conn) or the
// listening socket fails. The publisher is told when it forwards and why
// it stopped.
func (x *sessions) holdPublication(conn net.Conn, br *bufio.Reader, p *publication, l *lease) {
	ss := p.ss
	info := wire.Published{State: wire.PublishForwarding, Session: ss.Name, Host: p.host.String(), GuestPort: int(p.port), MaxConns: cap(p.slots), RequestID: p.reqID}
	p.auditSession("published " + p.describe())
	x.log.Info("session port published", "session", ss.Name, "host", info.Host, "guest_port", p.port, "uid", p.id.UID)
	go p.acceptLoop()
	_ = conn.SetWriteDeadline(time.Now().Add(writeStall))
	if err := wire.WriteJSONFrame(conn, wire.FrameResult, info); err != nil {
		p.stop("its publisher went away")
	}
	go func() {
		// The publisher sends nothing more: a read ends when it goes.
		_, _ = io.Copy(io.Discard, br)
		p.stop("its publisher went away")
	}()
	select {
	case <-p.done:
	case <-l.stopping():
		p.stop("vmgated stopped")
	}
	<-p.done
	ss.removePublication(p)
	x.rec.flushNet(p.gateKey())
	p.auditSession("unpublished " + p.describe() + ": " + p.why)
	x.log.Info("session port unpublished", "session", ss.Name, "host", info.Host, "why", p.why)
	info.State, info.Why = wire.PublishEnded, p.why
	_ = conn.SetWriteDeadline(time.Now().Add(writeStall))
	_ = wire.WriteJSONFrame(conn, wire.FrameResult, info)
}

// takeListener reads the client's one message after the upgrade: a byte
// carrying its listening socket (SCM_RIGHTS), within requestReadTimeout.
func takeListener(conn net.Conn) (*os.File, error) {
	uc, ok := conn.(interface {
		ReadMsgUnix(b, oob []byte) (n, oobn, flags int, addr *net.UnixAddr, err error)
	})
	if !ok {
		return nil, errors.New("not a Unix socket connection")
	}
	_ = conn.SetReadDeadline(time.Now().Add(requestReadTimeout))
	defer func() { _ = conn.SetReadDeadline(time.Time{}) }()
	// Room for every descriptor a message can carry: the kernel closes
	// the ones a receive has no room for in the receiver's thread.
	buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(maxPassedFDs*4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	var fds []int
	if cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
		for i := range cmsgs {
			got, _ := unix.ParseUnixRights(&cmsgs[i])
			fds = append(fds, got...)
		}
	}
	if err != nil || n != 1 || len(fds) != 1 || flags&unix.MSG_CTRUNC != 0 {
		for _, fd := range fds {
			dropPassed(fd)
		}
		if err != nil {
			return nil, fmt.Errorf("read the listening socket: %w", err)
		}
		return nil, errors.New("the client sent no listening socket (one byte with one descriptor)")
	}
	return os.NewFile(uintptr(fds[0]), "published-listener"), nil
}

// listenerAddr checks that f is a listening stream socket, TCP or Unix
// with a path, and returns its address as the kernel has it.
func listenerAddr(f *os.File) (policy.HostAddr, error) {
	fd := int(f.Fd())
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return policy.HostAddr{}, fmt.Errorf("the descriptor is not a socket: %w", err)
	}
	listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	if err != nil || typ != unix.SOCK_STREAM || listening != 1 {
		return policy.HostAddr{}, errors.New("the descriptor is not a listening stream socket")
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return policy.HostAddr{}, fmt.Errorf("the listening socket's address: %w", err)
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return policy.HostAddr{Addr: netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))}, nil
	case *unix.SockaddrInet6:
		return policy.HostAddr{Addr: netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))}, nil
	case *unix.SockaddrUnix:
		if !strings.HasPrefix(a.Name, "/") {
			return policy.HostAddr{}, fmt.Errorf("a Unix socket without a path (%q): abstract and unnamed sockets are not published", a.Name)
		}
		return policy.HostAddr{Unix: a.Name}, nil
	}
	return policy.HostAddr{}, errors.New("the listening socket is neither TCP nor a Unix socket")
}

// addPublication makes p one of the session's, if it can be: the session
// lives and has a NIC, and has fewer than wire.MaxPublished.
func (ss *session) addPublication(p *publication) *RequestError {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	switch {
	case ss.State == stateEnded:
		return &RequestError{Kind: wire.KindNotFound, Msg: fmt.Sprintf("session %q ended", ss.Name)}
	case !ss.Shape.Network:
		return &RequestError{Kind: ErrBadRequest, Msg: fmt.Sprintf("session %q has no network (its profile had none when it began): a port is published through the VM's NIC; end the session to start it again with one", ss.Name)}
	case len(ss.pubs) >= wire.MaxPublished:
		return &RequestError{Kind: ErrBadRequest, Msg: fmt.Sprintf("session %q has %d published ports, the most a session may have", ss.Name, wire.MaxPublished)}
	}
	ss.pubs = append(ss.pubs, p)
	return nil
}

func (ss *session) removePublication(p *publication) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for i, q := range ss.pubs {
		if q == p {
			ss.pubs = append(ss.pubs[:i], ss.pubs[i+1:]...)
			return
		}
	}
}

// stopPublications stops the session's published ports (its end):
// their listening sockets are closed when it returns.
func (ss *session) stopPublications(why string) {
	ss.mu.Lock()
	pubs := append([]*publication(nil), ss.pubs...)
	ss.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range pubs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(why)
		}()
	}
	wg.Wait()
}

// recheckPublications decides every published port again under pol (a
// reload): one the policy no longer allows (sessions.publish turned off,
// publish_any_address taken away) stops, and says why, as a session's end
// stops it. The stops run in the background: each waits for its
// connections to be audited.
func (x *sessions) recheckPublications(pol *policy.Policy) {
	for _, ss := range x.all() {
		ss.mu.Lock()
		pubs := append([]*publication(nil), ss.pubs...)
		ss.mu.Unlock()
		for _, p := range pubs {
			v := pol.DecidePublish(p.id, policy.PublishRequest{Session: ss.Name, GuestPort: int(p.port), Host: p.host, Image: ss.image()})
			if v.Allowed {
				continue
			}
			why := "the reloaded policy no longer allows it (" + v.Rule + "): " + v.Reason
			x.log.Warn("published port stopped", "session", ss.Name, "host", p.host.String(), "guest_port", p.port, "why", why)
			go p.stop(why)
		}
	}
}

// cutForwards ends the connections the session's published ports carry
// (a pause: its VM goes), and keeps the ports.
func (ss *session) cutForwards(why string) {
	ss.mu.Lock()
	pubs := append([]*publication(nil), ss.pubs...)
	ss.mu.Unlock()
	for _, p := range pubs {
		p.cut(why)
	}
}
