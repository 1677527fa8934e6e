// Package agentconn runs the agent protocol (package agentproto) over one
// byte stream: frames, requests, channels and their flow control, for both
// ends. The host (vmgated) uses [Dial] and then [Conn.Call] and
// [Conn.Open]; the guest agent answers with [Serve] and a [Handler].
//
// # Threat model
//
// The host reads what a guest writes, and the guest may be hostile: its
// root can replace the agent with any program. So on the host side every
// frame is bounded before it is read (agentproto.MaxGuestPayload; data
// frames agentproto.MaxData), a channel never buffers more than the
// window the host granted (agentproto.Window), frames a guest may not
// send, frames out of a channel's order and malformed payloads end the
// connection (the VM is then unusable and its owner destroys it), and
// frames for channels the host has closed are dropped. Nothing a guest
// sends can make the host allocate beyond those bounds, spin, or block
// anything but that connection. A guest that stops reading cannot block
// the host either: every frame the host writes has a deadline
// (WriteTimeout), and a write that misses it ends the connection (and
// with it the VM). The guest trusts the host (vmgated, which
// also owns the VM), so the guest side checks frames for well-formedness
// only.
//
// # Lock order
//
// Channel.mu, then Conn.mu: a channel may take its connection's lock,
// never the reverse. Conn.wmu (one frame at a time on the stream) is never
// taken while either is held, and nothing else is taken under it.
package agentconn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// WriteTimeout bounds the write of one frame by the host. A healthy
// agent drains its port within milliseconds; a guest that stops reading
// it for this long has given up its connection.
const WriteTimeout = 30 * time.Second

// deadliner is a stream whose writes can be given a deadline (a
// net.Conn).
type deadliner interface{ SetWriteDeadline(time.Time) error }

// ErrClosed reports use of a connection after it ended: closed by this
// side, hung up by the peer, or broken.
var ErrClosed = errors.New("agent connection closed")

// ProtocolError reports a peer that broke the protocol; the connection
// has been closed.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "agent protocol: " + e.Msg }

func violation(format string, args ...any) error {
	return &ProtocolError{Msg: fmt.Sprintf(format, args...)}
}

// Conn is one connection between the host and a guest agent.
type Conn struct {
	rw         io.ReadWriteCloser
	host       bool // this end is the host
	maxPayload int  // bound of the frames this end reads
	log        *slog.Logger
	// writeTimeout bounds each of the host's frame writes (WriteTimeout;
	// under wmu).
	writeTimeout time.Duration

	wmu  sync.Mutex // one frame at a time on rw
	wbuf []byte     // under wmu

	mu       sync.Mutex
	chans    map[uint32]*Channel
	calls    map[uint32]chan callResult // the host's calls waiting for replies
	nextID   uint32                     // the host's last id
	gotHello bool                       // the reader has seen the peer's hello
	err      error                      // why the connection ended
	done     chan struct{}              // closed when it ended

	hello chan agentproto.HelloReply // the host's: the agent's hello (cap 1)

	// The guest's: handler and what it runs.
	handler Handler
	version string          // the agent's, for the hello
	helloOK bool            // under mu: the host's hello was answered
	ctx     context.Context // ends with the connection
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func newConn(rw io.ReadWriteCloser, host bool, log *slog.Logger) *Conn {
	if log == nil {
		log = slog.Default()
	}
	c := &Conn{rw: rw, host: host, log: log, writeTimeout: WriteTimeout, chans: map[uint32]*Channel{}, done: make(chan struct{})}
	if host {
		c.maxPayload = agentproto.MaxGuestPayload
		c.calls = map[uint32]chan callResult{}
		c.hello = make(chan agentproto.HelloReply, 1)
	} else {
		c.maxPayload = agentproto.MaxHostPayload
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c
}

// SetWriteTimeout replaces the host's bound on each frame write
// (WriteTimeout); a write that misses it ends the connection.
func (c *Conn) SetWriteTimeout(d time.Duration) {
	c.wmu.Lock()
	c.writeTimeout = d
	c.wmu.Unlock()
}

// Done is closed when the connection has ended; Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (it wraps ErrClosed, or is a
// *ProtocolError or the stream's error), or nil while it lasts.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection: pending calls fail, channels see their end
// (the peer's commands are killed), the stream is closed. Closing twice
// is harmless.
func (c *Conn) Close() error {
	c.fail(ErrClosed)
	return nil
}

// fail ends the connection once, with err.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	if !errors.Is(err, ErrClosed) {
		var pe *ProtocolError
		if !errors.As(err, &pe) {
			err = fmt.Errorf("%w: %w", ErrClosed, err)
		}
	}
	c.err = err
	close(c.done)
	chans := c.chans
	c.chans = map[uint32]*Channel{}
	calls := c.calls
	c.calls = nil
	c.mu.Unlock()
	c.cancel()
	_ = c.rw.Close()
	for _, ch := range chans {
		ch.connGone()
	}
	for _, rc := range calls {
		rc <- callResult{err: err}
	}
}

// writeFrame sends one frame. An error ends the connection (a frame
// half-written leaves the stream unusable).
func (c *Conn) writeFrame(t agentproto.FrameType, id uint32, payload []byte) error {
	c.wmu.Lock()
	select {
	case <-c.done:
		c.wmu.Unlock()
		return c.Err()
	default:
	}
	c.wbuf = agentproto.AppendFrame(c.wbuf[:0], t, id, payload)
	if d, ok := c.rw.(deadliner); ok && c.host {
		_ = d.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	_, err := c.rw.Write(c.wbuf)
	if cap(c.wbuf) > 2*agentproto.MaxData+agentproto.HeaderSize {
		c.wbuf = nil // an Open's command line: do not keep it
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("write: %w", err))
		return c.Err()
	}
	return nil
}

// readLoop reads and dispatches frames until the stream ends or breaks
// or the peer breaks the protocol.
func (c *Conn) readLoop() {
	br := bufio.NewReaderSize(c.rw, 64<<10)
	var buf []byte
	for {
		f, err := agentproto.ReadFrame(br, &buf, c.maxPayload)
		if err == nil {
			err = c.dispatch(f)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("hung up: %w", err)
			}
			c.fail(err)
			return
		}
	}
}

// dispatch routes one frame.
func (c *Conn) dispatch(f agentproto.Frame) error {
	if c.host && !f.Type.FromGuest() || !c.host && !f.Type.FromHost() {
		return violation("%s frame from the %s", f.Type, c.peerName())
	}
	c.mu.Lock()
	first := !c.gotHello
	c.gotHello = true
	c.mu.Unlock()
	if first != (f.Type == agentproto.FrameHello) {
		if first {
			return violation("%s frame before hello", f.Type)
		}
		return violation("second hello")
	}
	if f.Type == agentproto.FrameHello {
		return c.onHello(f)
	}
	if f.ID == 0 {
		return violation("%s frame with id 0", f.Type)
	}
	switch f.Type {
	case agentproto.FrameCall:
		return c.onCall(f)
	case agentproto.FrameReply:
		return c.onReply(f)
	case agentproto.FrameOpen:
		return c.onOpen(f)
	}
	c.mu.Lock()
	ch := c.chans[f.ID]
	c.mu.Unlock()
	if ch == nil {
		// A channel this end has closed and forgotten (frames the peer
		// sent before it saw the close), or one never opened: a host
		// never reuses an id, so dropping them is safe.
		return nil
	}
	return ch.onFrame(f)
}

func (c *Conn) peerName() string {
	if c.host {
		return "guest"
	}
	return "host"
}

// forget removes a channel that is over at this end.
func (c *Conn) forget(id uint32) {
	c.mu.Lock()
	delete(c.chans, id)
	c.mu.Unlock()
}
