package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// MaxMessage bounds every JSON-RPC message the server writes, newline
// included. llama.cpp's MCP client reads its servers' stdout line by line
// into a buffer of 8 MiB: a longer line is dropped, and the call it
// answered then fails as "request timed out". The tools' own limits keep
// their results well under it (see TestLargestMessage); this bound is the
// last guard.
const MaxMessage = 8<<20 - 1

// errTooLarge is the error a client gets instead of a reply over
// MaxMessage.
const errTooLarge = -32603 // JSON-RPC internal error

// drainTransport wraps the SDK's transport with two guarantees the SDK
// does not give:
//
//   - Every request read before the client closed its side (stdin EOF) is
//     answered before the server stops: the SDK, once its reader sees EOF,
//     cancels the requests in flight and refuses to write their answers.
//     A client that writes its requests and then closes stdin (a script,
//     `printf … | vm-exec mcp`) would get nothing. So the read side holds
//     EOF back until each request read has had its answer written.
//   - No message written is over MaxMessage: a reply that would be is
//     replaced by a JSON-RPC error saying so, a notification is dropped
//     (and logged).
//   - A call the client cancelled (notifications/cancelled) is no longer
//     waited for at EOF, and its late answer is best effort: the client
//     has given it up, so a write that fails because the client has gone
//     since is no failure of the server (the SDK would end Run with it).
//     So is a notification: one the SDK sends after the client closed (a
//     list change it debounced) is nobody's loss.
type drainTransport struct {
	t   mcp.Transport
	log *slog.Logger
	// stop ends a read held back at EOF (Run's context: a signal).
	stop context.Context
}

func (d *drainTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := d.t.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &drainConn{Connection: c, log: d.log, stop: d.stop, pending: map[jsonrpc.ID]bool{}, cancelled: map[jsonrpc.ID]bool{},
		idle: make(chan struct{}), closed: make(chan struct{})}, nil
}

type drainConn struct {
	mcp.Connection
	log  *slog.Logger
	stop context.Context

	mu        sync.Mutex
	pending   map[jsonrpc.ID]bool // calls read and not yet answered
	cancelled map[jsonrpc.ID]bool // calls the client cancelled, not yet answered
	idle      chan struct{}       // closed (and replaced) when pending empties
	closed    chan struct{}
	once      sync.Once
}

// Read passes on the client's messages, noting each call; at EOF it
// returns only once every call read has been answered (or the connection
// was closed, or Run's context ended).
func (c *drainConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if err != nil {
		if errors.Is(err, io.EOF) {
			c.drain(ctx)
		}
		return nil, err
	}
	if req, ok := msg.(*jsonrpc.Request); ok {
		c.mu.Lock()
		switch {
		case req.IsCall():
			c.pending[req.ID] = true
		case req.Method == "notifications/cancelled":
			if id, ok := cancelledID(req); ok && c.pending[id] {
				c.cancelled[id] = true
				c.answeredLocked(id)
			}
		}
		c.mu.Unlock()
	}
	return msg, nil
}

// cancelledID is the id of the call a notifications/cancelled names.
func cancelledID(req *jsonrpc.Request) (jsonrpc.ID, bool) {
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(req.Params, &p) != nil || p.RequestID == nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	return id, err == nil
}

// answeredLocked notes that call id needs no more waiting for.
// Precondition: c.mu is held.
func (c *drainConn) answeredLocked(id jsonrpc.ID) {
	if !c.pending[id] {
		return
	}
	delete(c.pending, id)
	if len(c.pending) == 0 {
		close(c.idle)
		c.idle = make(chan struct{})
	}
}

// drain waits until no call read is unanswered.
func (c *drainConn) drain(ctx context.Context) {
	for {
		c.mu.Lock()
		n, idle := len(c.pending), c.idle
		c.mu.Unlock()
		if n == 0 {
			return
		}
		c.log.Info("client closed its input: answering the requests already read", "pending", n)
		select {
		case <-idle:
		case <-c.closed:
			return
		case <-ctx.Done():
			return
		case <-c.stop.Done():
			return
		}
	}
}

// Write writes msg, or its replacement when it is over MaxMessage, and
// notes an answered call.
func (c *drainConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	msg = c.bound(msg)
	if msg == nil {
		return nil
	}
	err := c.Connection.Write(ctx, msg)
	if resp, ok := msg.(*jsonrpc.Response); ok {
		c.mu.Lock()
		c.answeredLocked(resp.ID)
		given := c.cancelled[resp.ID]
		delete(c.cancelled, resp.ID)
		c.mu.Unlock()
		if given && err != nil {
			c.log.Debug("the answer of a call the client cancelled was not written", "id", resp.ID.Raw(), "err", err)
			return nil
		}
	}
	if req, ok := msg.(*jsonrpc.Request); ok && !req.IsCall() && err != nil {
		// A notification (a list change, a call's progress) that cannot
		// be written has nobody left to tell: the client went. The call
		// it belongs to, if any, fails with its answer.
		c.log.Debug("a notification was not written", "method", req.Method, "err", err)
		return nil
	}
	return err
}

// bound returns msg when its line fits MaxMessage; else an error reply to
// the same call, or nil (drop) for anything else.
func (c *drainConn) bound(msg jsonrpc.Message) jsonrpc.Message {
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil || len(b)+1 <= MaxMessage {
		return msg // an encoding error is the SDK's to report
	}
	resp, ok := msg.(*jsonrpc.Response)
	if !ok {
		c.log.Error("message over the size limit dropped", "bytes", len(b), "limit", MaxMessage)
		return nil
	}
	c.log.Error("reply over the size limit replaced by an error", "id", resp.ID.Raw(), "bytes", len(b), "limit", MaxMessage)
	return &jsonrpc.Response{ID: resp.ID, Error: &jsonrpc.Error{Code: errTooLarge,
		Message: fmt.Sprintf("vmgate: the reply (%d bytes) is over the %d-byte limit of one message; ask for less output", len(b), MaxMessage)}}
}

func (c *drainConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Connection.Close()
}
