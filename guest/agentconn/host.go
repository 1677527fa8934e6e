package agentconn

import (
	"context"
	"encoding"
	"fmt"
	"io"
	"log/slog"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// Client starts the host's end of a connection on rw and sends the
// hello; Hello waits for the agent's answer. Calls and opens may be sent
// before it arrives: the agent takes frames in order.
func Client(rw io.ReadWriteCloser, log *slog.Logger) *Conn {
	c := newConn(rw, true, log)
	go c.readLoop()
	b, _ := agentproto.Hello{Protocol: agentproto.Protocol}.MarshalBinary()
	_ = c.writeFrame(agentproto.FrameHello, 0, b) // a failure ends c, which Hello reports
	return c
}

// Hello waits for the agent's answer to the hello: the readiness signal.
func (c *Conn) Hello(ctx context.Context) (agentproto.HelloReply, error) {
	select {
	case r := <-c.hello:
		c.hello <- r // for a later caller
		return r, nil
	case <-c.done:
		return agentproto.HelloReply{}, c.Err()
	case <-ctx.Done():
		return agentproto.HelloReply{}, ctx.Err()
	}
}

// onHello takes the agent's hello (the host's reader).
func (c *Conn) onHello(f agentproto.Frame) error {
	if !c.host {
		return c.answerHello(f)
	}
	var r agentproto.HelloReply
	if err := r.UnmarshalBinary(f.Payload); err != nil {
		return violation("%v", err)
	}
	if r.Error != "" {
		return violation("the agent refused the connection: %.200s", r.Error)
	}
	if r.Protocol != agentproto.Protocol {
		return violation("the agent speaks protocol %d, not %d", r.Protocol, agentproto.Protocol)
	}
	c.hello <- r
	return nil
}

// callResult is the reply to one call, or why there is none.
type callResult struct {
	reply agentproto.Reply
	err   error
}

// CallError is the agent's refusal of a call.
type CallError struct {
	Op, Msg string
}

func (e *CallError) Error() string { return fmt.Sprintf("agent: %s: %s", e.Op, e.Msg) }

// Call sends the call op with args (nil for none) and waits for its
// reply, whose result it decodes into result (unless nil). An error
// reply is a *CallError. When ctx ends first, the reply is dropped when
// it comes.
func (c *Conn) Call(ctx context.Context, op string, args encoding.BinaryMarshaler, result encoding.BinaryUnmarshaler) error {
	var raw []byte
	if args != nil {
		b, err := args.MarshalBinary()
		if err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		raw = b
	}
	p, _ := agentproto.Call{Op: op, Args: raw}.MarshalBinary()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", op, c.err)
	}
	c.nextID++
	id := c.nextID
	rc := make(chan callResult, 1)
	c.calls[id] = rc
	c.mu.Unlock()
	if err := c.writeFrame(agentproto.FrameCall, id, p); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	select {
	case r := <-rc:
		if r.err != nil {
			return fmt.Errorf("%s: %w", op, r.err)
		}
		if r.reply.Error != "" {
			return &CallError{Op: op, Msg: r.reply.Error}
		}
		if result != nil {
			if err := result.UnmarshalBinary(r.reply.Result); err != nil {
				return fmt.Errorf("%s: result: %w", op, err)
			}
		}
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.calls, id)
		c.mu.Unlock()
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
}

// onReply takes a reply (the host's reader).
func (c *Conn) onReply(f agentproto.Frame) error {
	var r agentproto.Reply
	if err := r.UnmarshalBinary(f.Payload); err != nil {
		return violation("%v", err)
	}
	c.mu.Lock()
	rc := c.calls[f.ID]
	delete(c.calls, f.ID)
	c.mu.Unlock()
	if rc != nil { // nil: a call whose caller gave up
		rc <- callResult{reply: r}
	}
	return nil
}

// RefusedError is the agent's refusal of a command.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "the agent refused the command: " + e.Reason }

// Open opens a channel for the command o and waits for the agent to
// accept it. A refusal is a *RefusedError. When ctx ends first, the
// channel is closed.
func (c *Conn) Open(ctx context.Context, o agentproto.Open) (*Channel, error) {
	p, _ := o.MarshalBinary()
	if len(p) > agentproto.MaxHostPayload {
		return nil, fmt.Errorf("open: the command's description is %d bytes, at most %d", len(p), agentproto.MaxHostPayload)
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, fmt.Errorf("open: %w", c.err)
	}
	c.nextID++
	ch := newChannel(c, c.nextID)
	c.chans[ch.id] = ch
	c.mu.Unlock()
	if err := c.writeFrame(agentproto.FrameOpen, ch.id, p); err != nil {
		c.forget(ch.id)
		return nil, fmt.Errorf("open: %w", err)
	}
	select {
	case <-ch.opened:
	case <-ctx.Done():
		_ = ch.Close()
		return nil, fmt.Errorf("open: %w", ctx.Err())
	}
	ch.mu.Lock()
	refused, reason, gone := ch.refused, ch.reason, ch.gone
	ch.mu.Unlock()
	switch {
	case refused:
		return nil, &RefusedError{Reason: reason}
	case gone:
		return nil, fmt.Errorf("open: %w", c.Err())
	}
	return ch, nil
}

// onCall and onOpen are the guest's: a guest never sends them.
func (c *Conn) onCall(f agentproto.Frame) error {
	if c.host {
		return violation("call from the guest")
	}
	return c.serveCall(f)
}

func (c *Conn) onOpen(f agentproto.Frame) error {
	if c.host {
		return violation("open from the guest")
	}
	return c.serveOpen(f)
}

// Signal sends the command's process group the signal name (an RFC 4254
// name: "TERM", "KILL", …).
func (ch *Channel) Signal(name string) error {
	return ch.control(agentproto.FrameSignal, []byte(name))
}

// Resize sends a terminal command its terminal's new size.
func (ch *Channel) Resize(cols, rows uint32) error {
	return ch.control(agentproto.FrameResize, agentproto.EncodeResize(cols, rows))
}

// Exited is closed when the command's exit record arrived, or when the
// channel or the connection ended without one; ExitStatus then says
// which.
func (ch *Channel) Exited() <-chan struct{} { return ch.exited }

// ExitStatus returns the command's exit record, if it arrived.
func (ch *Channel) ExitStatus() (agentproto.Exit, bool) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.exit == nil {
		return agentproto.Exit{}, false
	}
	return *ch.exit, true
}
