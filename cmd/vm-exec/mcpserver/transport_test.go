package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// goneConn is a connection whose client has gone: it reads the messages
// it was given, then EOF, and every write fails.
type goneConn struct{ in []jsonrpc.Message }

func (c *goneConn) Read(context.Context) (jsonrpc.Message, error) {
	if len(c.in) == 0 {
		return nil, io.EOF
	}
	m := c.in[0]
	c.in = c.in[1:]
	return m, nil
}
func (c *goneConn) Write(context.Context, jsonrpc.Message) error { return io.ErrClosedPipe }
func (c *goneConn) Close() error                                 { return nil }
func (c *goneConn) SessionID() string                            { return "" }

// TestDrainCancelledCall: the late answer of a call the client cancelled
// is best effort (the client gave it up, and may have gone since: a
// cancel followed by the end of its input is common), and the drain at
// EOF does not wait for it; the answer of a call not cancelled that
// cannot be written is still an error. Without it, a client that
// cancelled a call and closed its side at once made `vm-exec mcp` end
// with "write on closed pipe".
func TestDrainCancelledCall(t *testing.T) {
	id := func(n int64) jsonrpc.ID {
		v, err := jsonrpc.MakeID(float64(n))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	call := func(n int64) *jsonrpc.Request {
		return &jsonrpc.Request{ID: id(n), Method: "tools/call", Params: json.RawMessage(`{}`)}
	}
	cancel := &jsonrpc.Request{Method: "notifications/cancelled", Params: json.RawMessage(`{"requestId": 1, "reason": "user"}`)}
	gone := &goneConn{in: []jsonrpc.Message{call(1), call(2), cancel}}
	c := &drainConn{Connection: gone, log: slog.New(slog.NewTextHandler(io.Discard, nil)), stop: context.Background(),
		pending: map[jsonrpc.ID]bool{}, cancelled: map[jsonrpc.ID]bool{}, idle: make(chan struct{}), closed: make(chan struct{})}
	ctx := context.Background()
	for range 3 {
		if _, err := c.Read(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(c.pending) != 1 || !c.pending[id(2)] {
		t.Fatalf("pending after a cancel of call 1: %v", c.pending)
	}
	if err := c.Write(ctx, &jsonrpc.Response{ID: id(1), Result: json.RawMessage(`{}`)}); err != nil {
		t.Errorf("the late answer of a cancelled call: %v, want no error", err)
	}
	if err := c.Write(ctx, &jsonrpc.Response{ID: id(2), Result: json.RawMessage(`{}`)}); !errors.Is(err, io.ErrClosedPipe) {
		t.Errorf("the answer of a call not cancelled: %v, want the write's error", err)
	}
	// A notification after the client went is nobody's loss.
	if err := c.Write(ctx, &jsonrpc.Request{Method: "notifications/tools/list_changed"}); err != nil {
		t.Errorf("a notification to a client gone: %v, want no error", err)
	}
	// EOF: nothing is pending, so the read ends at once.
	if _, err := c.Read(ctx); !errors.Is(err, io.EOF) {
		t.Errorf("read at the end: %v", err)
	}
}
