package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
)

// rawConn is a client that speaks JSON-RPC lines to a Server as a stdio
// client does, byte for byte: the tests see the wire (sizes, order,
// answers after EOF) that the SDK's client hides.
type rawConn struct {
	t    *testing.T
	in   *io.PipeWriter // the server's stdin
	out  *bufio.Reader  // the server's stdout
	done chan error     // Run's result

	// The reader reads a line of the server's stdout for each token in
	// want, and only then: until a test asks for a message, the server's
	// writes block, as to a client that does not read.
	want  chan struct{}
	lines chan []byte // closed at EOF
	eof   bool
}

func startRaw(t *testing.T, c *client.Client) *rawConn {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	srv := New(Options{Client: c, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Version: "test"})
	r := &rawConn{t: t, in: inW, out: bufio.NewReaderSize(outR, 1<<20), done: make(chan error, 1),
		want: make(chan struct{}, 1), lines: make(chan []byte, 1)}
	go func() {
		err := srv.Run(context.Background(), &mcp.IOTransport{Reader: inR, Writer: outW})
		_ = outW.Close()
		r.done <- err
	}()
	go func() {
		defer close(r.lines)
		for range r.want {
			line, err := r.out.ReadBytes('\n')
			if err != nil {
				return
			}
			r.lines <- line
		}
	}()
	t.Cleanup(func() {
		_ = inW.Close()
		for { // read to the end: a blocked writer finishes
			if _, ok := r.line(time.Minute); !ok {
				break
			}
		}
		select {
		case <-r.done:
		case <-time.After(time.Minute):
			t.Error("server did not stop after stdin closed")
		}
	})
	return r
}

// line reads the next line of the server's stdout; ok is false at EOF or
// when none came within d.
func (r *rawConn) line(d time.Duration) (line []byte, ok bool) {
	if r.eof {
		return nil, false
	}
	select {
	case r.want <- struct{}{}:
	default: // a line is already asked for
	}
	select {
	case line, ok := <-r.lines:
		r.eof = !ok
		return line, ok
	case <-time.After(d):
		return nil, false
	}
}

// send writes one message as a line.
func (r *rawConn) send(v any) {
	r.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.in.Write(append(b, '\n')); err != nil {
		r.t.Fatalf("write to the server: %v", err)
	}
}

// rawMsg is any JSON-RPC message.
type rawMsg struct {
	ID     any             `json:"id"`
	Method string          `json:"method"`
	Params json.RawMessage `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	size int // the line's length, newline included
}

// next returns the next message; ok is false at EOF.
func (r *rawConn) next(d time.Duration) (rawMsg, bool) {
	r.t.Helper()
	if r.eof {
		return rawMsg{}, false
	}
	select {
	case r.want <- struct{}{}:
	default: // a line is already asked for
	}
	select {
	case line, ok := <-r.lines:
		if !ok {
			r.eof = true
			return rawMsg{}, false
		}
		var m rawMsg
		if err := json.Unmarshal(line, &m); err != nil {
			r.t.Fatalf("a line that is not JSON: %v: %.200s", err, line)
		}
		m.size = len(line)
		if m.size > MaxMessage {
			r.t.Errorf("a message of %d bytes: over MaxMessage (%d)", m.size, MaxMessage)
		}
		return m, true
	case <-time.After(d):
		r.t.Fatalf("no message from the server within %v", d)
	}
	return rawMsg{}, false
}

// reply reads messages until the answer to id, returning it and the
// notifications before it.
func (r *rawConn) reply(id int, d time.Duration) (rawMsg, []rawMsg) {
	r.t.Helper()
	var notes []rawMsg
	for {
		m, ok := r.next(d)
		if !ok {
			r.t.Fatalf("EOF before the answer to %d", id)
		}
		if m.Method != "" {
			notes = append(notes, m)
			continue
		}
		if f, ok := m.ID.(float64); ok && int(f) == id {
			return m, notes
		}
		r.t.Fatalf("answer to %v while waiting for %d", m.ID, id)
	}
}

func call(id int, method string, params any) map[string]any {
	return map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params}
}

// handshake2024 is llama.cpp's start: initialize at 2024-11-05, then
// notifications/initialized.
func (r *rawConn) handshake2024() {
	r.t.Helper()
	r.send(call(0, "initialize", map[string]any{"protocolVersion": "2024-11-05", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "llama.cpp", "version": "test"}}))
	m, _ := r.reply(0, 10*time.Second)
	var init struct {
		ProtocolVersion string `json:"protocolVersion"`
	}
	if err := json.Unmarshal(m.Result, &init); err != nil || init.ProtocolVersion != "2024-11-05" {
		r.t.Fatalf("initialize: %s %v", m.Result, err)
	}
	r.send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
}

// meta2026 is the _meta every request of the 2026-07-28 revision carries
// (no initialize: each request says who it is).
func meta2026(extra map[string]any) map[string]any {
	m := map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": map[string]any{},
		"io.modelcontextprotocol/clientInfo":         map[string]any{"name": "raw-2026", "version": "0"},
	}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// toolResult decodes a tools/call answer.
type toolResult struct {
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
	StructuredContent *ExecOutput    `json:"structuredContent"`
	IsError           bool           `json:"isError"`
	Meta              map[string]any `json:"_meta"`
}

func decodeTool(t *testing.T, m rawMsg) toolResult {
	t.Helper()
	if m.Error != nil {
		t.Fatalf("tools/call: JSON-RPC error %d %s", m.Error.Code, m.Error.Message)
	}
	var r toolResult
	if err := json.Unmarshal(m.Result, &r); err != nil || len(r.Content) != 1 || r.Content[0].Type != "text" {
		t.Fatalf("tools/call result %.300s: %v", m.Result, err)
	}
	return r
}

// TestRevisions: the same server answers a client of the 2024-11-05
// revision (llama.cpp's: initialize first) and one of 2026-07-28
// (stateless: server/discover, then requests that each carry the
// protocol version in _meta, no initialize), with the same tools and the
// same result text; the new revision's lists carry ttlMs.
func TestRevisions(t *testing.T) {
	g := startFakeGateway(t)
	wantText := "ran: echo hi\n\n[exit code: 0]"

	t.Run("2024-11-05", func(t *testing.T) {
		r := startRaw(t, g.Client)
		r.handshake2024()
		r.send(call(1, "tools/list", map[string]any{}))
		m, _ := r.reply(1, 10*time.Second)
		checkRawTools(t, m)
		r.send(call(2, "tools/call", map[string]any{"name": shelltool.Name, "arguments": map[string]any{"command": "echo hi"}}))
		m, _ = r.reply(2, 10*time.Second)
		res := decodeTool(t, m)
		if res.Content[0].Text != wantText || res.IsError {
			t.Errorf("text %q (isError %v), want %q", res.Content[0].Text, res.IsError, wantText)
		}
	})
	t.Run("2026-07-28", func(t *testing.T) {
		r := startRaw(t, g.Client)
		r.send(call(1, "server/discover", map[string]any{"_meta": meta2026(nil)}))
		m, _ := r.reply(1, 10*time.Second)
		var disc struct {
			SupportedVersions []string       `json:"supportedVersions"`
			TTLMs             int            `json:"ttlMs"`
			Instructions      string         `json:"instructions"`
			Capabilities      map[string]any `json:"capabilities"`
		}
		if err := json.Unmarshal(m.Result, &disc); err != nil || m.Error != nil {
			t.Fatalf("server/discover: %s %v %+v", m.Result, err, m.Error)
		}
		if !strings.Contains(strings.Join(disc.SupportedVersions, " "), "2026-07-28") ||
			!strings.Contains(strings.Join(disc.SupportedVersions, " "), "2024-11-05") {
			t.Errorf("supportedVersions %v: want 2026-07-28 and 2024-11-05", disc.SupportedVersions)
		}
		if disc.TTLMs != listTTL || disc.Capabilities["tools"] == nil || disc.Instructions != Instructions {
			t.Errorf("discover: ttlMs %d, capabilities %v, instructions %q", disc.TTLMs, disc.Capabilities, disc.Instructions)
		}
		r.send(call(2, "tools/list", map[string]any{"_meta": meta2026(nil)}))
		m, _ = r.reply(2, 10*time.Second)
		checkRawTools(t, m)
		var list struct {
			TTLMs int `json:"ttlMs"`
		}
		if err := json.Unmarshal(m.Result, &list); err != nil || list.TTLMs != listTTL {
			t.Errorf("tools/list ttlMs %d, want %d (%v)", list.TTLMs, listTTL, err)
		}
		r.send(call(3, "tools/call", map[string]any{"name": shelltool.Name, "arguments": map[string]any{"command": "echo hi"},
			"_meta": meta2026(nil)}))
		m, _ = r.reply(3, 10*time.Second)
		res := decodeTool(t, m)
		if res.Content[0].Text != wantText || res.IsError {
			t.Errorf("text %q (isError %v), want %q", res.Content[0].Text, res.IsError, wantText)
		}
		if res.StructuredContent == nil || res.StructuredContent.Output != "ran: echo hi\n" || res.StructuredContent.VM != "vm-fake" {
			t.Errorf("structuredContent %+v", res.StructuredContent)
		}
		if info, _ := res.Meta["io.modelcontextprotocol/serverInfo"].(map[string]any); info["name"] != Name {
			t.Errorf("the reply's _meta does not name the server: %v", res.Meta)
		}
		// initialize belongs to the old revision: a request that says it
		// speaks the new one may not use it.
		r.send(call(4, "initialize", map[string]any{"protocolVersion": "2026-07-28", "_meta": meta2026(nil)}))
		if m, _ = r.reply(4, 10*time.Second); m.Error == nil {
			t.Errorf("initialize under 2026-07-28 answered %s", m.Result)
		}
	})
}

// checkRawTools checks a tools/list answer on the wire: every tool, its
// annotations and, for the command tools, an output schema.
func checkRawTools(t *testing.T, m rawMsg) {
	t.Helper()
	var list struct {
		Tools []struct {
			Name         string          `json:"name"`
			Annotations  map[string]any  `json:"annotations"`
			OutputSchema json.RawMessage `json:"outputSchema"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(m.Result, &list); err != nil || m.Error != nil {
		t.Fatalf("tools/list: %s %v", m.Result, err)
	}
	if len(list.Tools) != len(annotations) {
		t.Errorf("%d tools, want %d", len(list.Tools), len(annotations))
	}
	for _, tool := range list.Tools {
		if tool.Annotations["title"] == "" || tool.Annotations["openWorldHint"] == nil {
			t.Errorf("%s: annotations %v", tool.Name, tool.Annotations)
		}
		withSchema := tool.Name == shelltool.Name || tool.Name == ToolSessionExec
		if (len(tool.OutputSchema) > 0) != withSchema {
			t.Errorf("%s: outputSchema %s", tool.Name, tool.OutputSchema)
		}
	}
}

// TestSDKClients: the SDK's own client, at the newest revision (it then
// speaks 2026-07-28: server/discover, no initialize) and pinned to
// 2024-11-05, reaches the same tools and gets typed results.
func TestSDKClients(t *testing.T) {
	g := startFakeGateway(t)
	for _, v := range []string{"", "2024-11-05"} {
		t.Run("version "+v, func(t *testing.T) {
			tc := connectOpts(t, g.Client, nil, &mcp.ClientSessionOptions{ProtocolVersion: v})
			want := v
			if want == "" {
				want = "2026-07-28"
			}
			if got := tc.cs.InitializeResult().ProtocolVersion; got != want {
				t.Fatalf("negotiated %q, want %q", got, want)
			}
			checkToolList(t, tc.cs)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := tc.cs.CallTool(ctx, &mcp.CallToolParams{Name: shelltool.Name, Arguments: map[string]any{"command": "exit 3"}})
			if err != nil {
				t.Fatal(err)
			}
			var out ExecOutput
			b, _ := json.Marshal(res.StructuredContent)
			if err := json.Unmarshal(b, &out); err != nil || out.ExitCode != 3 || out.RequestID != "req-fake" {
				t.Errorf("structuredContent %s: %v", b, err)
			}
			if text := res.Content[0].(*mcp.TextContent).Text; text != "\n[exit code: 3]" {
				t.Errorf("text %q", text)
			}
		})
	}
}

// progressLog collects a client's progress notifications.
type progressLog struct {
	mu    sync.Mutex
	notes []*mcp.ProgressNotificationParams
	on    func(*mcp.ProgressNotificationParams)
}

func (p *progressLog) handler(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	p.mu.Lock()
	p.notes = append(p.notes, req.Params)
	on := p.on
	p.mu.Unlock()
	if on != nil {
		on(req.Params)
	}
}

func (p *progressLog) get() []*mcp.ProgressNotificationParams {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*mcp.ProgressNotificationParams(nil), p.notes...)
}

// TestProgress: a command that runs over a second sends its output as it
// comes, in progress notifications, when the client gave a progress
// token, and only then; the notifications' progress grows.
func TestProgress(t *testing.T) {
	g := startFakeGateway(t)
	plog := &progressLog{}
	tc := connectOpts(t, g.Client, &mcp.ClientOptions{ProgressNotificationHandler: plog.handler}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	params := &mcp.CallToolParams{Name: shelltool.Name, Arguments: map[string]any{"command": "slow 8"}}
	params.SetProgressToken("p-1")
	res, err := tc.cs.CallTool(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	final := res.Content[0].(*mcp.TextContent).Text
	notes := plog.get()
	if len(notes) < 1 {
		t.Fatalf("no progress notification for a 2.4 s command; result %q", final)
	}
	var streamed strings.Builder
	last := 0.0
	for _, n := range notes {
		if n.ProgressToken != "p-1" || n.Progress <= last {
			t.Errorf("notification %+v after progress %v", n, last)
		}
		last = n.Progress
		streamed.WriteString(n.Message)
	}
	if streamed.Len() == 0 || !strings.HasPrefix(final, streamed.String()) {
		t.Errorf("streamed %q is not the start of the result %q", streamed.String(), final)
	}

	before := len(plog.get())
	res, err = tc.cs.CallTool(ctx, &mcp.CallToolParams{Name: shelltool.Name, Arguments: map[string]any{"command": "slow 5"}})
	if err != nil || res.IsError {
		t.Fatal(err, res)
	}
	if n := len(plog.get()) - before; n != 0 {
		t.Errorf("%d progress notifications without a progress token", n)
	}
}

// TestCancelKillsCommand: notifications/cancelled (the SDK's client sends
// it when the call's context ends) closes the command's exec stream at
// once, which is how the daemon learns to kill it: here the fake daemon
// sees the stream go within a second of the cancel.
func TestCancelKillsCommand(t *testing.T) {
	g := startFakeGateway(t)
	plog := &progressLog{}
	tc := connectOpts(t, g.Client, &mcp.ClientOptions{ProgressNotificationHandler: plog.handler}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var cancelledAt time.Time
	var once sync.Once
	plog.on = func(p *mcp.ProgressNotificationParams) {
		if strings.Contains(p.Message, "started") {
			once.Do(func() { cancelledAt = time.Now(); cancel() })
		}
	}
	params := &mcp.CallToolParams{Name: shelltool.Name, Arguments: map[string]any{"command": "hang", "timeout": 60}}
	params.SetProgressToken(7)
	_, err := tc.cs.CallTool(ctx, params)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	gone := g.waitEvent(t, "gone", 10*time.Second)
	t.Logf("gone %v after the cancel", gone.at.Sub(cancelledAt))
	if d := gone.at.Sub(cancelledAt); d > time.Second {
		t.Errorf("the exec stream closed %v after the cancel, want < 1s", d)
	}
	// The server goes on serving.
	if text, isErr := tc.call(t, shelltool.Name, map[string]any{"command": "exit 0"}); isErr || text != "\n[exit code: 0]" {
		t.Errorf("after a cancel: %q", text)
	}
}

// TestStdinEOF: a client that writes its requests and closes stdin gets
// every answer before the server exits (the SDK alone cancels them at
// EOF and writes nothing).
func TestStdinEOF(t *testing.T) {
	g := startFakeGateway(t)
	r := startRaw(t, g.Client)
	r.handshake2024()
	cmds := map[int]string{1: "slow 4", 2: "exit 3", 3: "echo last"}
	for id := 1; id <= 3; id++ {
		r.send(call(id, "tools/call", map[string]any{"name": shelltool.Name, "arguments": map[string]any{"command": cmds[id]}}))
	}
	r.send(call(4, "tools/list", map[string]any{}))
	_ = r.in.Close()
	got := map[int]string{}
	for {
		m, ok := r.next(30 * time.Second)
		if !ok {
			break
		}
		id, _ := m.ID.(float64)
		if m.Error != nil {
			t.Errorf("answer %v: error %+v", m.ID, m.Error)
			continue
		}
		if id == 4 {
			got[4] = "tools"
			continue
		}
		got[int(id)] = decodeTool(t, m).Content[0].Text
	}
	want := map[int]string{1: "tick 0\ntick 1\ntick 2\ntick 3\n\n[exit code: 0]", 2: "\n[exit code: 3]", 3: "ran: echo last\n\n[exit code: 0]", 4: "tools"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("answers after EOF:\n got %v\nwant %v", got, want)
	}
	if err := <-r.done; err != nil {
		t.Errorf("Run: %v", err)
	}
	r.done <- nil // for the cleanup
}

// TestStalledConsumer: a client that stops reading while a command floods
// output (with a progress token) does not slow the command: the daemon's
// stream is drained to its end while nothing is read, and what the
// client reads afterwards is cut at max_output_size and marked.
func TestStalledConsumer(t *testing.T) {
	g := startFakeGateway(t)
	r := startRaw(t, g.Client)
	r.handshake2024()
	const limit = 1000
	r.send(call(1, "tools/call", map[string]any{"name": shelltool.Name,
		"arguments": map[string]any{"command": "flood 8388608", "max_output_size": limit},
		"_meta":     map[string]any{"progressToken": "flood"}}))
	// Not reading: the first notification (at 1 s) blocks in its write,
	// and the flood (2.6 s) must still reach its end.
	g.waitEvent(t, "flooded", 15*time.Second)
	m, notes := r.reply(1, 30*time.Second)
	res := decodeTool(t, m)
	if want := strings.Repeat("x", limit) + shelltool.TruncatedMarker + "\n[exit code: 0]"; res.Content[0].Text != want {
		t.Errorf("result %.80q…, want %d x, the mark, the exit code", res.Content[0].Text, limit)
	}
	if s := res.StructuredContent; s == nil || !s.Truncated || len(s.Output) != limit {
		t.Errorf("structured %+v", s)
	}
	if len(notes) == 0 {
		t.Fatal("no progress notification: the test did not stall a write")
	}
	var streamed strings.Builder
	for _, n := range notes {
		var p mcp.ProgressNotificationParams
		if err := json.Unmarshal(n.Params, &p); err != nil {
			t.Fatal(err)
		}
		streamed.WriteString(p.Message)
	}
	if s := streamed.String(); len(s) > limit+len(shelltool.TruncatedMarker) || !strings.HasPrefix(s, "x") {
		t.Errorf("streamed %d bytes (%.40q…), want at most %d and the mark", len(s), s, limit)
	}
}

// TestLargestMessage: the largest answers the tools can give stay under
// MaxMessage, the line length llama.cpp's client accepts: a
// session_read_file of max_bytes (1 MiB) of bytes that JSON writes six
// times as long, and an exec_shell_command of max_output_size such bytes,
// which its text and structured content both carry.
func TestLargestMessage(t *testing.T) {
	g := startFakeGateway(t)
	g.files["/big"] = []byte(strings.Repeat("\x01", 2*maxRead))
	r := startRaw(t, g.Client)
	r.handshake2024()
	r.send(call(1, "tools/call", map[string]any{"name": ToolSessionStart, "arguments": map[string]any{"name": "s"}}))
	r.reply(1, 10*time.Second)
	r.send(call(2, "tools/call", map[string]any{"name": ToolSessionReadFile, "arguments": map[string]any{"session": "s", "path": "/big", "max_bytes": maxRead}}))
	m, _ := r.reply(2, 30*time.Second)
	res := decodeTool(t, m)
	if !strings.HasPrefix(res.Content[0].Text, strings.Repeat("\x01", maxRead)) || !strings.HasSuffix(res.Content[0].Text, "[truncated: the first 1048576 bytes]") {
		t.Errorf("read_file: %d bytes, isError %v", len(res.Content[0].Text), res.IsError)
	}
	t.Logf("session_read_file of %d bytes: a message of %d bytes (limit %d)", maxRead, m.size, MaxMessage)
	r.send(call(3, "tools/call", map[string]any{"name": shelltool.Name, "arguments": map[string]any{"command": `bytes 100000 \x01`}}))
	m, _ = r.reply(3, 30*time.Second)
	if res := decodeTool(t, m); res.StructuredContent == nil || len(res.StructuredContent.Output) != shelltool.DefaultMaxOutputSize {
		t.Errorf("exec: %+v", res.StructuredContent)
	}
	t.Logf("exec_shell_command of %d bytes: a message of %d bytes", shelltool.DefaultMaxOutputSize, m.size)
}

// TestBound: a reply over MaxMessage is replaced by a JSON-RPC error to
// the same call; a notification over it is dropped.
func TestBound(t *testing.T) {
	c := &drainConn{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	id, _ := jsonrpc.MakeID(float64(9))
	big, _ := json.Marshal(strings.Repeat("a", MaxMessage))
	small := &jsonrpc.Response{ID: id, Result: json.RawMessage(`{}`)}
	if c.bound(small) != small {
		t.Error("a small reply was changed")
	}
	got, ok := c.bound(&jsonrpc.Response{ID: id, Result: big}).(*jsonrpc.Response)
	if !ok || got.ID != id || got.Error == nil || !strings.Contains(got.Error.Error(), "over the") {
		t.Errorf("large reply became %+v", got)
	}
	if b, _ := jsonrpc.EncodeMessage(got); len(b) > 1000 {
		t.Errorf("its replacement is %d bytes", len(b))
	}
	if m := c.bound(&jsonrpc.Request{Method: "notifications/progress", Params: big}); m != nil {
		t.Errorf("large notification kept: %T", m)
	}
}

// TestLiveOutput: what progress messages carry.
func TestLiveOutput(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int
		writes []string
		takes  []string // after each write
	}{
		{"plain", 100, []string{"ab", "", "cd"}, []string{"ab", "", "cd"}},
		{"a character cut between writes waits", 100, []string{"a\xc3", "\xa9b"}, []string{"a", "éb"}},
		{"cut at the limit, marked once", 5, []string{"abc", "defg", "h"}, []string{"abc", "de" + shelltool.TruncatedMarker, ""}},
		{"exactly the limit is not marked", 3, []string{"abc"}, []string{"abc"}},
		{"invalid bytes", 100, []string{"\xffx"}, []string{"\uFFFDx"}},
	} {
		o := newLiveOutput(tc.limit)
		for i, w := range tc.writes {
			_, _ = o.Write([]byte(w))
			if got := o.take(); got != tc.takes[i] {
				t.Errorf("%s: take %d = %q, want %q", tc.name, i, got, tc.takes[i])
			}
		}
	}
}

// TestOpenWorldFromProfile: the command tools' openWorldHint says whether
// the caller's profile grants its VMs a network, as the daemon's status
// tells: true for a profile with a network, false for one without. A list
// waits for the daemon's answer (probeWait at most), so a client that
// lists once gets it; one that listed before a slow daemon answered is
// told by a list-changed notification, and its earlier list was not
// cacheable.
func TestOpenWorldFromProfile(t *testing.T) {
	hints := func(tc *testConn) map[string]bool {
		t.Helper()
		res, err := tc.cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, tool := range res.Tools {
			if a := tool.Annotations; a != nil && a.OpenWorldHint != nil {
				out[tool.Name] = *a.OpenWorldHint
			}
		}
		return out
	}
	t.Run("with a network", func(t *testing.T) {
		g := startFakeGateway(t)
		tc := connect(t, g.Client, nil)
		if h := hints(tc); !h[shelltool.Name] || !h[ToolSessionExec] || h[ToolSessionReadFile] {
			t.Errorf("hints %v", h)
		}
	})
	t.Run("without", func(t *testing.T) {
		g := startFakeGateway(t)
		g.mu.Lock()
		g.grant = &wire.Grant{Profile: "offline", Shell: true}
		g.mu.Unlock()
		changed := make(chan struct{}, 8)
		tc := connectOpts(t, g.Client, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			changed <- struct{}{}
		}}, nil)
		if h := hints(tc); h[shelltool.Name] || h[ToolSessionExec] {
			t.Errorf("hints of a profile without a network, at the first list: %v", h)
		}
		select {
		case <-changed:
			t.Error("a list-changed notification for a list that never changed for this client")
		default:
		}
	})
	t.Run("a daemon slower than the first list", func(t *testing.T) {
		g := startFakeGateway(t)
		gate := make(chan struct{})
		g.mu.Lock()
		g.grant, g.statusGate = &wire.Grant{Profile: "offline", Shell: true}, gate
		g.mu.Unlock()
		changed := make(chan struct{}, 8)
		tc := connectOpts(t, g.Client, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			changed <- struct{}{}
		}}, nil)
		t0 := time.Now()
		if h := hints(tc); !h[shelltool.Name] || !h[ToolSessionExec] || time.Since(t0) < probeWait {
			t.Errorf("the first list, with the daemon silent: %v after %v", h, time.Since(t0))
		}
		close(gate)
		select {
		case <-changed:
		case <-time.After(10 * time.Second):
			t.Fatal("no list-changed notification after the daemon said the profile has no network")
		}
		if h := hints(tc); h[shelltool.Name] || h[ToolSessionExec] {
			t.Errorf("hints after the notification: %v (a list the client cached before?)", h)
		}
	})
}
