package mcpserver

import (
	"context"
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
	return &drainConn{Connection: c, log: d.log, stop: d.stop, pending: map[jsonrpc.ID]bool{},
		idle: make(chan struct{}), closed: make(chan struct{})}, nil
}

type drainConn struct {
	mcp.Connection
	log  *slog.Logger
	stop context.Context

	mu      sync.Mutex
	pending map[jsonrpc.ID]bool // calls read and not yet answered
	idle    chan struct{}       // closed (and replaced) when pending empties
	closed  chan struct{}
	once    sync.Once
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
	if req, ok := msg.(*jsonrpc.Request); ok && req.IsCall() {
		c.mu.Lock()
		c.pending[req.ID] = true
		c.mu.Unlock()
	}
	return msg, nil
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
		if c.pending[resp.ID] {
			delete(c.pending, resp.ID)
			if len(c.pending) == 0 {
				close(c.idle)
				c.idle = make(chan struct{})
			}
		}
		c.mu.Unlock()
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
