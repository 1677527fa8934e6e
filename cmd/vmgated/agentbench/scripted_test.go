package agentbench

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// scriptedTurn is one response of the scripted endpoint.
type scriptedTurn struct {
	Content   string  // message content ("" = null)
	Reasoning string  // reasoning_content
	Calls     []rawTC // tool calls, arguments exactly as the model "wrote" them
	Check     func(t *testing.T, msgs []seenMessage)
}

type rawTC struct {
	Name string
	Args string // a JSON string's content; ObjArgs sends an object instead
	// ObjArgs sends the arguments as a JSON object, as some servers do.
	ObjArgs bool
}

type seenMessage struct {
	Role       string `json:"role"`
	Content    *string
	ToolCallID string `json:"tool_call_id"`
	ToolCalls  []struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

// scriptedServer is an OpenAI-compatible chat completions endpoint that
// replays a fixed conversation, in the wire format llama-server --jinja
// speaks (streaming or not, as each request asks), and checks every
// request it gets: the tools offered, and a history in which every tool
// call has valid JSON arguments and exactly one answer.
type scriptedServer struct {
	t     *testing.T
	turns []scriptedTurn
	mu    sync.Mutex
	seen  [][]seenMessage
	seeds []int64 // the seed of each request that sent one
	*httptest.Server
}

func newScripted(t *testing.T, turns []scriptedTurn) *scriptedServer {
	s := &scriptedServer{t: t, turns: turns}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handle)
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func (s *scriptedServer) requests() [][]seenMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen
}

func (s *scriptedServer) handle(w http.ResponseWriter, r *http.Request) {
	t := s.t
	var req struct {
		Model    string           `json:"model"`
		Messages []seenMessage    `json:"messages"`
		Tools    []map[string]any `json:"tools"`
		Choice   string           `json:"tool_choice"`
		Stream   bool             `json:"stream"`
		Seed     *int64           `json:"seed"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		t.Errorf("request: %v", err)
		http.Error(w, err.Error(), 400)
		return
	}
	// Tools: exec_shell_command with llama-server's schema, and done.
	names := map[string]map[string]any{}
	for _, tl := range req.Tools {
		if tl["type"] != "function" {
			t.Errorf("tool type %v", tl["type"])
		}
		f, _ := tl["function"].(map[string]any)
		n, _ := f["name"].(string)
		names[n] = f
	}
	if f := names["exec_shell_command"]; f == nil {
		t.Errorf("exec_shell_command not offered: %v", req.Tools)
	} else {
		props := f["parameters"].(map[string]any)["properties"].(map[string]any)
		for _, p := range []string{"command", "timeout", "max_output_size"} {
			if props[p] == nil {
				t.Errorf("exec_shell_command lacks %s", p)
			}
		}
	}
	if names["done"] == nil || req.Choice != "auto" {
		t.Errorf("done not offered or tool_choice %q", req.Choice)
	}
	// History: system, user, then assistant/tool pairs with valid JSON.
	msgs := req.Messages
	if len(msgs) < 2 || msgs[0].Role != "system" || msgs[1].Role != "user" {
		t.Errorf("history must start with system and user: %+v", msgs)
	}
	pending := map[string]bool{}
	assistants := 0
	for _, m := range msgs {
		switch m.Role {
		case "assistant":
			assistants++
			if len(pending) > 0 {
				t.Errorf("tool calls %v unanswered before the next assistant message", pending)
			}
			for _, c := range m.ToolCalls {
				if c.ID == "" || c.Type != "function" || pending[c.ID] {
					t.Errorf("bad tool call in history: %+v", c)
				}
				if !json.Valid([]byte(c.Function.Arguments)) {
					t.Errorf("history holds unparsed arguments %q", c.Function.Arguments)
				}
				pending[c.ID] = true
			}
		case "tool":
			if !pending[m.ToolCallID] {
				t.Errorf("tool answer for unknown id %q", m.ToolCallID)
			}
			delete(pending, m.ToolCallID)
			if m.Content == nil {
				t.Errorf("tool answer %q without content", m.ToolCallID)
			}
		}
	}
	s.mu.Lock()
	s.seen = append(s.seen, msgs)
	if req.Seed != nil {
		s.seeds = append(s.seeds, *req.Seed)
	}
	s.mu.Unlock()
	if assistants >= len(s.turns) {
		if s.turns != nil {
			t.Errorf("request %d beyond the script", assistants+1)
		}
		http.Error(w, `{"error":{"message":"script exhausted"}}`, 500)
		return
	}
	turn := s.turns[assistants]
	if turn.Check != nil {
		turn.Check(t, msgs)
	}
	id := func(i int) string { return fmt.Sprintf("call_%d_%d", assistants, i) }
	if !req.Stream {
		msg := map[string]any{"role": "assistant", "content": nil}
		if turn.Content != "" {
			msg["content"] = turn.Content
		}
		if turn.Reasoning != "" {
			msg["reasoning_content"] = turn.Reasoning
		}
		var calls []map[string]any
		for i, c := range turn.Calls {
			var args any = c.Args
			if c.ObjArgs {
				args = json.RawMessage(c.Args)
			}
			calls = append(calls, map[string]any{"id": id(i), "type": "function", "function": map[string]any{"name": c.Name, "arguments": args}})
		}
		if calls != nil {
			msg["tool_calls"] = calls
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"id": "chatcmpl-1", "object": "chat.completion", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "message": msg, "finish_reason": "tool_calls"}},
			"usage":   map[string]any{"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})
		return
	}
	// Streaming: role first, then reasoning and content in pieces, then
	// each call's id and name and its arguments in three pieces, then
	// the usage chunk and [DONE].
	w.Header().Set("Content-Type", "text/event-stream")
	send := func(delta map[string]any, extra map[string]any) {
		ch := map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": nil}}}
		for k, v := range extra {
			ch[k] = v
		}
		b, _ := json.Marshal(ch)
		fmt.Fprintf(w, "data: %s\n\n", b)
	}
	send(map[string]any{"role": "assistant", "content": nil}, nil)
	for _, p := range pieces(turn.Reasoning, 3) {
		send(map[string]any{"reasoning_content": p}, nil)
	}
	for _, p := range pieces(turn.Content, 4) {
		send(map[string]any{"content": p}, nil)
	}
	for i, c := range turn.Calls {
		send(map[string]any{"tool_calls": []any{map[string]any{"index": i, "id": id(i), "type": "function",
			"function": map[string]any{"name": c.Name, "arguments": ""}}}}, nil)
		for _, p := range pieces(c.Args, 3) {
			send(map[string]any{"tool_calls": []any{map[string]any{"index": i, "function": map[string]any{"arguments": p}}}}, nil)
		}
	}
	b, _ := json.Marshal(map[string]any{"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": []any{},
		"usage": map[string]any{"prompt_tokens": 100, "completion_tokens": 10}})
	fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
}

// pieces splits s into at most n non-empty parts.
func pieces(s string, n int) []string {
	if s == "" {
		return nil
	}
	var out []string
	size := (len(s) + n - 1) / n
	for len(s) > 0 {
		k := min(size, len(s))
		out = append(out, s[:k])
		s = s[k:]
	}
	return out
}

// lastTool returns the content of the last tool message in msgs.
func lastTool(msgs []seenMessage) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == "tool" && msgs[i].Content != nil {
			return *msgs[i].Content
		}
	}
	return ""
}

// expectTool makes a turn check that the previous tool answer contains want.
func expectTool(want string) func(*testing.T, []seenMessage) {
	return func(t *testing.T, msgs []seenMessage) {
		t.Helper()
		if got := lastTool(msgs); !strings.Contains(got, want) {
			t.Errorf("tool answer %q does not contain %q", got, want)
		}
	}
}
