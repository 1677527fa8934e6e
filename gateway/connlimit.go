package gateway

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
)

// Connection bounds of the local API. A caller that opens connections and
// leaves them idle, sends a request head or body slowly, or stops reading
// its output, holds one file descriptor and some memory per connection:
// the bounds keep that from adding up to a denial of service for others.
const (
	// DefaultMaxConnsPerUID bounds one uid's open connections.
	DefaultMaxConnsPerUID = 64
	// DefaultConnIdle closes a kept-alive connection without a request.
	DefaultConnIdle = 60 * time.Second
	// requestReadTimeout bounds reading a request's head and body.
	requestReadTimeout = 10 * time.Second
	// writeStall ends an exec whose client has not taken its output for
	// this long: it is gone, or holds its VM without reading.
	writeStall = 60 * time.Second
)

// uidLimitListener identifies each connection's caller (peercred_linux.go)
// and accepts at most max open connections per caller uid: the login's,
// for a subordinate uid, so that a login's 65,536 subordinate uids share
// one bound. It answers the ones over with a busy refusal and closes them
// (logging that at most once a minute per uid), and refuses a connection
// whose caller cannot be identified the same way, with the cause.
type uidLimitListener struct {
	net.Listener
	max   int
	log   *slog.Logger
	peers *peerResolver
	// refusing bounds the connections being refused at once; beyond it a
	// connection is closed without an answer.
	refusing chan struct{}

	mu     sync.Mutex
	open   map[uint32]int
	warned map[uint32]time.Time
	// unidentified counts the connections refused since unknownWarned,
	// when the last warning about them was logged (one a minute).
	unidentified  int
	unknownWarned time.Time
}

// maxRefusing bounds concurrent refusals, refuseTime each one: a burst of
// clients over their bound (200 at once in TestGateway_Load, 136 of them
// over) is answered, not reset, even when their processes are slow to
// send their requests; each refusal holds a descriptor for at most
// refuseTime.
const (
	maxRefusing = 512
	refuseTime  = 5 * time.Second
)

func newUIDLimitListener(ln net.Listener, max int, log *slog.Logger) *uidLimitListener {
	return &uidLimitListener{Listener: ln, max: max, log: log, peers: newPeerResolver(DefaultSubUIDFile, log),
		open: map[uint32]int{}, warned: map[uint32]time.Time{}, refusing: make(chan struct{}, maxRefusing)}
}

// refuse answers a connection with the error e and closes it: 503 busy
// for one over the limit, as the exec core's busy refusals are, so that
// the client says busy (exit 202) instead of seeing its connection reset;
// 401 for a caller that cannot be identified, as the handlers answer. It
// reads the request first: closing a Unix socket with unread data resets
// the peer's end.
func (l *uidLimitListener) refuse(c net.Conn, kind *wire.Kind, msg string) {
	defer func() { <-l.refusing }()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(refuseTime))
	in := io.LimitReader(c, 1<<20)
	if req, err := http.ReadRequest(bufio.NewReader(in)); err == nil {
		_, _ = io.Copy(io.Discard, req.Body)
	}
	status := kind.Status
	body, _ := json.Marshal(wire.Error{Code: kind.Code, Error: msg})
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, in)
}

func (l *uidLimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		id, cred, err := l.peers.identify(c)
		if err != nil {
			l.refuseUnidentified(c, cred, err)
			continue
		}
		if id.SubUID != 0 {
			l.log.Debug("caller counted as the login of its subordinate uid", "uid", id.UID, "user", id.User, "subuid", id.SubUID, "pid", id.PID)
		}
		l.mu.Lock()
		if l.open[id.UID] >= l.max {
			now := time.Now()
			if now.Sub(l.warned[id.UID]) > time.Minute {
				l.warned[id.UID] = now
				l.log.Warn("too many connections from one uid, refusing more", "uid", id.UID, "max", l.max)
			}
			l.mu.Unlock()
			l.refuseAsync(c, wire.KindBusy,
				fmt.Sprintf("uid %d has %d connections open to vmgated, the most it may; try again when one ends", id.UID, l.max))
			continue
		}
		l.open[id.UID]++
		l.mu.Unlock()
		return &identConn{UnixConn: c.(*net.UnixConn), id: id, release: func() { l.release(id.UID) }}, nil
	}
}

// refuseAsync refuses c in the bounded refusal pool, or closes it when
// the pool is full.
func (l *uidLimitListener) refuseAsync(c net.Conn, kind *wire.Kind, msg string) {
	select {
	case l.refusing <- struct{}{}:
		go l.refuse(c, kind, msg)
	default:
		_ = c.Close()
	}
}

// refuseUnidentified refuses a connection whose caller cannot be
// identified, naming the cause to the client and, at most once a minute,
// in the log. Such a connection takes no place in any uid's count: it is
// answered and closed in the bounded refusal pool, never served.
func (l *uidLimitListener) refuseUnidentified(c net.Conn, cred peerCred, err error) {
	l.mu.Lock()
	l.unidentified++
	if now := time.Now(); now.Sub(l.unknownWarned) > time.Minute {
		l.log.Warn("refusing connections whose caller cannot be identified", "err", err, "peer_uid", cred.UID, "pid", cred.PID, "refused", l.unidentified)
		l.unknownWarned, l.unidentified = now, 0
	}
	l.mu.Unlock()
	l.refuseAsync(c, wire.KindUnidentified, "vmgated cannot identify the caller: "+err.Error())
}

func (l *uidLimitListener) release(uid uint32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[uid]--; l.open[uid] <= 0 {
		delete(l.open, uid)
	}
}

// identConn is an accepted connection with its peer's identity, read
// once; closing it frees its place in the per-uid count.
type identConn struct {
	*net.UnixConn
	id      policy.Identity
	once    sync.Once
	release func()
}

// Close frees the connection's place before closing it: a peer that sees
// the close may connect again at once and must find the place free.
func (c *identConn) Close() error {
	c.once.Do(c.release)
	err := c.UnixConn.Close()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
