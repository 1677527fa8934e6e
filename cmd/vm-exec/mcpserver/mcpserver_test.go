package mcpserver

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/internal/testutil"
)

// testConn is a Server serving an SDK client over in-memory transports.
type testConn struct {
	srv  *Server
	cs   *mcp.ClientSession
	done chan error // Run's result
}

// connect starts a Server for c and connects the SDK's client to it. The
// server is stopped (and its Run result checked) at cleanup unless the test
// closes the client itself and reads done.
func connect(t *testing.T, c *client.Client, log *slog.Logger) *testConn {
	t.Helper()
	return connectLog(t, c, log, nil, nil)
}

// connectOpts is connect with client and session options.
func connectOpts(t *testing.T, c *client.Client, co *mcp.ClientOptions, so *mcp.ClientSessionOptions) *testConn {
	t.Helper()
	return connectLog(t, c, nil, co, so)
}

func connectLog(t *testing.T, c *client.Client, log *slog.Logger, co *mcp.ClientOptions, so *mcp.ClientSessionOptions) *testConn {
	t.Helper()
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	st, ct := mcp.NewInMemoryTransports()
	tc := &testConn{srv: New(Options{Client: c, Log: log, Version: "test"}), done: make(chan error, 1)}
	go func() { tc.done <- tc.srv.Run(context.Background(), st) }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "vmgate-test", Version: "0"}, co).Connect(ctx, ct, so)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	tc.cs = cs
	t.Cleanup(func() { tc.close(t) })
	return tc
}

// close closes the client and returns once Run has returned (nil on a
// clean end: every session ended).
func (tc *testConn) close(t *testing.T) error {
	t.Helper()
	if tc.cs == nil {
		return nil
	}
	_ = tc.cs.Close()
	tc.cs = nil
	select {
	case err := <-tc.done:
		if err != nil {
			t.Errorf("server Run: %v", err)
		}
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("server did not stop after the client closed")
	}
	return nil
}

// call calls tool and returns its text and IsError.
func (tc *testConn) call(t *testing.T, tool string, args map[string]any) (string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := tc.cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: protocol error %v", tool, args, err)
	}
	if len(res.Content) != 1 {
		t.Fatalf("%s %v: %d content items, want 1 text", tool, args, len(res.Content))
	}
	text, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("%s %v: content %T, want text", tool, args, res.Content[0])
	}
	return text.Text, res.IsError
}

// asJSON is v as the client sees it after a JSON round trip.
func asJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// checkToolList checks the handshake and tools/list as a client sees them.
func checkToolList(t *testing.T, cs *mcp.ClientSession) {
	t.Helper()
	init := cs.InitializeResult()
	if init.ServerInfo == nil || init.ServerInfo.Name != Name || init.ServerInfo.Version == "" {
		t.Errorf("server info %+v", init.ServerInfo)
	}
	if !strings.Contains(init.Instructions, "disposable Linux") || init.Capabilities.Tools == nil {
		t.Errorf("instructions %q, capabilities %+v", init.Instructions, init.Capabilities)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	schemas := map[string]any{}
	for _, tool := range res.Tools {
		if tool.Description == "" {
			t.Errorf("tool %s has no description", tool.Name)
		}
		schemas[tool.Name] = tool.InputSchema
	}
	want := map[string]any{
		shelltool.Name:   asJSON(t, execSchema()),
		ToolSessionExec:  asJSON(t, sessionExecSchema()),
		ToolSessionStart: nil, ToolSessionEnd: nil, ToolSessionWriteFile: nil, ToolSessionReadFile: nil, ToolSessionPause: nil, ToolSessionFork: nil, ToolSessionNetLock: nil, ToolReceipt: nil,
		ToolProcStart: nil, ToolProcOutput: nil, ToolProcInput: nil, ToolProcKill: nil,
	}
	if len(schemas) != len(want) {
		t.Errorf("tools %v, want %d", schemas, len(want))
	}
	for name, w := range want {
		got, ok := schemas[name]
		if !ok {
			t.Errorf("no tool %s", name)
			continue
		}
		if w != nil && !reflect.DeepEqual(asJSON(t, got), w) {
			t.Errorf("%s schema = %v, want %v", name, got, w)
		}
	}
	if !strings.Contains(asString(t, schemas[ToolSessionEnd]), `"required":["session"]`) {
		t.Errorf("session_end schema %v", schemas[ToolSessionEnd])
	}
	if !strings.Contains(asString(t, schemas[ToolSessionStart]), `"name"`) {
		t.Errorf("session_start schema %v", schemas[ToolSessionStart])
	}
}

func asString(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestToolsList needs no gateway: listing tools does not reach it.
func TestToolsList(t *testing.T) {
	tc := connect(t, client.New(filepath.Join(t.TempDir(), "none.sock")), nil)
	checkToolList(t, tc.cs)
}

// TestNoGateway: every call the gateway cannot carry out is a tool error
// with a text that says why; argument errors too; never a protocol error.
func TestNoGateway(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	tc := connect(t, client.New(sock), nil)
	for _, c := range []struct {
		tool string
		args map[string]any
		want []string
	}{
		{shelltool.Name, map[string]any{"command": "uname -a"}, []string{"vmgate: cannot reach vmgated at " + sock, "is vmgated running?", "\n[exit code: -1]"}},
		{shelltool.Name, map[string]any{"cmd": "ls"}, []string{`invalid arguments: "command" is missing`}},
		{shelltool.Name, map[string]any{"command": "ls", "timeout": 2.5}, []string{"not an integer"}},
		{ToolSessionStart, nil, []string{"vmgate: ", "cannot reach vmgated"}},
		{ToolSessionStart, map[string]any{"name": "../x"}, []string{"not a session name"}},
		{ToolSessionExec, map[string]any{"session": "s1", "command": "ls"}, []string{`no session "s1"`, ToolSessionStart}},
		{ToolSessionExec, map[string]any{"command": "ls"}, []string{`"session" is missing`}},
		{ToolSessionEnd, map[string]any{"session": "s1"}, []string{`no session "s1"`}},
	} {
		text, isErr := tc.call(t, c.tool, c.args)
		if !isErr {
			t.Errorf("%s %v: not an error: %q", c.tool, c.args, text)
		}
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s %v: %q lacks %q", c.tool, c.args, text, w)
			}
		}
	}
	if err := tc.close(t); err != nil {
		t.Fatal(err)
	}
}

// TestRunTwice: a Server serves one client.
func TestRunTwice(t *testing.T) {
	tc := connect(t, client.New(filepath.Join(t.TempDir(), "none.sock")), nil)
	st, _ := mcp.NewInMemoryTransports()
	if err := tc.srv.Run(context.Background(), st); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("second Run: %v", err)
	}
}

// TestCancel: cancelling Run's context (SIGTERM in vm-exec) stops the
// server without an error.
func TestCancel(t *testing.T) {
	st, ct := mcp.NewInMemoryTransports()
	srv := New(Options{Client: client.New(filepath.Join(t.TempDir(), "none.sock")), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return after cancel")
	}
}

// TestAnswersWhileDaemonHangs: initialize and tools/list are answered at
// once while the daemon accepts connections but does not answer yet (a
// daemon still starting), not after a probe of it.
func TestAnswersWhileDaemonHangs(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "slow.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	testutil.HoldConns(t, ln)
	st, ct := mcp.NewInMemoryTransports()
	srv := New(Options{Client: client.New(sock), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "test"})
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go func() { _ = srv.Run(ctx, st) }()
	cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "vmgate-test", Version: "0"}, nil).Connect(cctx, ct, nil)
	if err != nil {
		t.Fatalf("initialize while the daemon does not answer: %v", err)
	}
	defer cs.Close()
	if tools, err := cs.ListTools(cctx, nil); err != nil || len(tools.Tools) == 0 {
		t.Fatalf("tools/list while the daemon does not answer: %v", err)
	}
}
