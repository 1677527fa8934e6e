package agentconn

import (
	"context"
	"encoding"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// Handler serves a host: its calls and its commands' channels.
type Handler interface {
	// Call answers one call, in a goroutine of its own; ctx ends with
	// the connection. A nil result is an empty one.
	Call(ctx context.Context, op string, args []byte) (encoding.BinaryMarshaler, error)
	// Open runs one command, in a goroutine of its own: it accepts or
	// rejects ch, runs the command, sends its output and exit record,
	// and returns when done with ch (Serve then closes it). ctx ends
	// with the connection.
	Open(ctx context.Context, ch *Channel, o agentproto.Open)
}

// ServeConfig configures Serve.
type ServeConfig struct {
	Handler      Handler
	AgentVersion string // in the hello
	Log          *slog.Logger
}

// Serve serves one host connection on rw until the host hangs up, the
// connection breaks or ctx is done; then it closes rw and returns once
// every handler goroutine has returned. helloDone says whether the host's
// hello arrived (a peer that does not speak the protocol never sends
// one). Serve returns nil when the host hung up, ctx.Err() when ctx ended
// the connection, and the error otherwise.
func Serve(ctx context.Context, rw io.ReadWriteCloser, cfg ServeConfig) (helloDone bool, err error) {
	if cfg.Handler == nil {
		_ = rw.Close()
		return false, errors.New("serve: no handler")
	}
	c := newConn(rw, false, cfg.Log)
	c.handler = cfg.Handler
	c.version = cfg.AgentVersion
	stop := context.AfterFunc(ctx, func() { c.fail(ctx.Err()) })
	defer stop()
	c.readLoop()
	c.wg.Wait()
	c.mu.Lock()
	helloDone, err = c.helloOK, c.err
	c.mu.Unlock()
	switch {
	case ctx.Err() != nil:
		return helloDone, ctx.Err()
	case errors.Is(err, io.EOF):
		return helloDone, nil
	}
	return helloDone, err
}

// answerHello answers the host's hello (the guest's reader; the host's
// reader never blocks, so writing here cannot stall).
func (c *Conn) answerHello(f agentproto.Frame) error {
	var h agentproto.Hello
	if err := h.UnmarshalBinary(f.Payload); err != nil {
		return violation("%v", err)
	}
	r := agentproto.HelloReply{Protocol: agentproto.Protocol, AgentVersion: c.version}
	if h.Protocol != agentproto.Protocol {
		r.Error = fmt.Sprintf("this agent speaks protocol %d, not %d", agentproto.Protocol, h.Protocol)
	}
	b, _ := r.MarshalBinary()
	if err := c.writeFrame(agentproto.FrameHello, 0, b); err != nil {
		return err
	}
	if r.Error != "" {
		return violation("%s", r.Error)
	}
	c.mu.Lock()
	c.helloOK = true
	c.mu.Unlock()
	return nil
}

// serveCall runs the handler for a call and sends its reply.
func (c *Conn) serveCall(f agentproto.Frame) error {
	var call agentproto.Call
	if err := call.UnmarshalBinary(f.Payload); err != nil {
		return violation("%v", err)
	}
	call.Args = append([]byte(nil), call.Args...) // f.Payload is the reader's buffer
	id := f.ID
	c.wg.Go(func() {
		res, err := c.handler.Call(c.ctx, call.Op, call.Args)
		var r agentproto.Reply
		if err == nil && res != nil {
			r.Result, err = res.MarshalBinary()
		}
		if err != nil {
			r = agentproto.Reply{Error: err.Error()}
		}
		b, _ := r.MarshalBinary()
		if len(b) > agentproto.MaxGuestPayload {
			b, _ = agentproto.Reply{Error: fmt.Sprintf("reply of %d bytes, at most %d", len(b), agentproto.MaxGuestPayload)}.MarshalBinary()
		}
		_ = c.writeFrame(agentproto.FrameReply, id, b)
	})
	return nil
}

// serveOpen registers a new channel and runs the handler for it.
func (c *Conn) serveOpen(f agentproto.Frame) error {
	c.mu.Lock()
	if _, dup := c.chans[f.ID]; dup {
		c.mu.Unlock()
		return violation("open of channel %d, which is open", f.ID)
	}
	ch := newChannel(c, f.ID)
	c.chans[f.ID] = ch
	c.mu.Unlock()
	var o agentproto.Open
	if err := o.UnmarshalBinary(f.Payload); err != nil {
		c.wg.Go(func() { _ = ch.Reject(err.Error()) })
		return nil
	}
	c.wg.Go(func() {
		c.handler.Open(c.ctx, ch, o)
		ch.mu.Lock()
		answered := ch.answered
		ch.mu.Unlock()
		if !answered {
			_ = ch.Reject("the agent did not take the command")
			return
		}
		_ = ch.Close()
	})
	return nil
}

// Accept tells the host that the command was accepted.
func (ch *Channel) Accept() error {
	ch.mu.Lock()
	if ch.answered {
		ch.mu.Unlock()
		return errors.New("agent channel: answered twice")
	}
	ch.answered = true
	ch.mu.Unlock()
	return ch.c.writeFrame(agentproto.FrameOpenOK, ch.id, nil)
}

// Reject tells the host that the command was refused, and why; the
// channel is then over.
func (ch *Channel) Reject(reason string) error {
	ch.mu.Lock()
	if ch.answered {
		ch.mu.Unlock()
		return errors.New("agent channel: answered twice")
	}
	ch.answered, ch.localClosed = true, true
	ch.cond.Broadcast()
	ch.mu.Unlock()
	ch.c.forget(ch.id)
	if len(reason) > agentproto.MaxReason {
		reason = reason[:agentproto.MaxReason]
	}
	return ch.c.writeFrame(agentproto.FrameOpenFail, ch.id, []byte(strings.ToValidUTF8(reason, "?")))
}

// Exit sends the command's exit record.
func (ch *Channel) Exit(e agentproto.Exit) error {
	return ch.control(agentproto.FrameExit, agentproto.EncodeExit(e))
}

// NextEvent waits for the host's next signal or resize; false means the
// channel is over (the host closed it or the connection ended).
func (ch *Channel) NextEvent() (Event, bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for len(ch.events) == 0 && !ch.remoteClosed && !ch.gone {
		ch.cond.Wait()
	}
	if len(ch.events) == 0 {
		return Event{}, false
	}
	e := ch.events[0]
	ch.events = ch.events[1:]
	return e, true
}
