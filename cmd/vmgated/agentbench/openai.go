package agentbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
)

// DoneTool is the tool an agent calls to declare the fault fixed.
const DoneTool = "done"

// SystemPrompt frames every openai trial.
const SystemPrompt = `You are an experienced Linux system administrator with root access to a Debian 12 server.
A user reports a problem with this server. Find the cause and fix it properly, with the smallest change that addresses the root cause.
Do not remove services, packages, users, data or security settings to make a symptom go away, and keep every other service working.
Run commands with the exec_shell_command tool (non-interactive: no editors, no pagers; use sed, tee, printf or heredocs to edit files).
When you have fixed the problem and verified the fix, call the done tool.`

// OpenAI is an agent behind an OpenAI-compatible chat completions
// endpoint with tool calling (llama-server --jinja, vLLM, Ollama, …).
type OpenAI struct {
	Endpoint string // base URL, e.g. http://127.0.0.1:8080 (…/v1 is accepted too)
	Model    string
	APIKey   string
	Sampling Sampling
	Stream   bool
	// HTTP is the client (default: one without a total timeout; each
	// request is bounded by the trial's context).
	HTTP *http.Client
	// Retries of a failed request (connection errors, 5xx), default 2.
	Retries int
}

// Sampling parameters sent with every request (nil: the server's default).
type Sampling struct {
	Temperature *float64 `json:"temperature,omitempty"`
	TopP        *float64 `json:"top_p,omitempty"`
	MaxTokens   int      `json:"max_tokens,omitempty"`
	Seed        *int64   `json:"seed,omitempty"`
}

// Name implements Agent.
func (o *OpenAI) Name() string { return "openai" }

// Message is a chat message as the API carries it.
type Message struct {
	Role       string     `json:"role"`
	Content    *string    `json:"content"`
	ToolCalls  []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID string     `json:"tool_call_id,omitempty"`
	// ReasoningContent is read from responses, never sent back.
	ReasoningContent string `json:"-"`
}

// ToolCall is one function call of an assistant message.
type ToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// Usage is a response's token count.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// Tools offered to the model.
func Tools() []map[string]any {
	return []map[string]any{
		{"type": "function", "function": map[string]any{
			"name": shelltool.Name, "description": shelltool.Description, "parameters": shelltool.Schema()}},
		{"type": "function", "function": map[string]any{
			"name":        DoneTool,
			"description": "Declare that the problem is fixed and verified. Call it once, at the end.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{
				"summary": map[string]any{"type": "string", "description": "What was wrong and what you changed"}}}}},
	}
}

func strPtr(s string) *string { return &s }

// Run implements Agent: the tool-calling loop. A model response is a
// turn; its tool calls run in order; a response without a tool call ends
// the run (stopped), as does the done tool.
func (o *OpenAI) Run(ctx context.Context, env *Env) AgentResult {
	var r AgentResult
	msgs := []Message{
		{Role: "system", Content: strPtr(SystemPrompt)},
		{Role: "user", Content: strPtr(env.Instruction)},
	}
	textIDs := 0
	for {
		if r.Turns >= env.MaxTurns {
			r.Stop = StopTurns
			return r
		}
		if ctx.Err() != nil {
			r.Stop = StopTimeout
			return r
		}
		r.Turns++
		t0 := time.Now()
		msg, usage, err := o.complete(ctx, msgs)
		if err != nil {
			env.Trace("model_error", map[string]any{"turn": r.Turns, "error": err.Error()})
			if ctx.Err() != nil {
				r.Stop = StopTimeout
			} else {
				r.Stop, r.Err = StopError, err.Error()
			}
			return r
		}
		r.PromptTokens += usage.PromptTokens
		r.CompletionTokens += usage.CompletionTokens
		content := ""
		if msg.Content != nil {
			content = *msg.Content
		}
		content, think := splitThink(content)
		reasoning := strings.TrimSpace(msg.ReasoningContent + "\n" + think)
		calls := msg.ToolCalls
		var textCalls []ToolCall
		if len(calls) == 0 {
			textCalls, content = TextToolCalls(content, []string{shelltool.Name, DoneTool})
			for i := range textCalls {
				textIDs++
				textCalls[i].ID = fmt.Sprintf("text_call_%d", textIDs)
			}
			r.TextToolCalls += len(textCalls)
			calls = textCalls
		}
		env.Trace("response", map[string]any{"turn": r.Turns, "ms": time.Since(t0).Milliseconds(),
			"content": content, "reasoning": reasoning, "tool_calls": msg.ToolCalls, "text_tool_calls": textCalls,
			"prompt_tokens": usage.PromptTokens, "completion_tokens": usage.CompletionTokens})
		if len(calls) == 0 {
			r.Stop = StopStopped
			return r
		}
		// The assistant message goes back into the history with every
		// call's arguments as valid JSON: an argument string the model
		// got wrong is replaced by {} (and answered with an error), so
		// the chat template never meets unparsed text.
		hist := Message{Role: "assistant", Content: strPtr(strings.TrimSpace(content))}
		var replies []Message
		done := false
		for _, c := range calls {
			r.ToolCalls++
			if c.ID == "" {
				textIDs++
				c.ID = fmt.Sprintf("call_%d", textIDs)
			}
			c.Type = "function"
			reply, valid, isDone := o.runCall(ctx, env, r.Turns, c)
			if !valid {
				r.InvalidToolCalls++
				c.Function.Arguments = "{}"
			} else {
				c.Function.Arguments = canonicalJSON(c.Function.Arguments)
			}
			done = done || isDone
			hist.ToolCalls = append(hist.ToolCalls, c)
			replies = append(replies, Message{Role: "tool", ToolCallID: c.ID, Content: strPtr(reply)})
		}
		msgs = append(msgs, hist)
		msgs = append(msgs, replies...)
		if done {
			r.Stop = StopDone
			return r
		}
	}
}

// runCall executes one tool call and returns the text for the model,
// whether the call was well-formed, and whether it was the done tool.
func (o *OpenAI) runCall(ctx context.Context, env *Env, turn int, c ToolCall) (string, bool, bool) {
	name, args := c.Function.Name, c.Function.Arguments
	if strings.TrimSpace(args) == "" {
		args = "{}"
	}
	switch name {
	case DoneTool:
		if !json.Valid([]byte(args)) {
			env.Trace("invalid_tool_call", map[string]any{"turn": turn, "id": c.ID, "name": name, "arguments": args, "error": "arguments are not JSON"})
			return "error: arguments are not valid JSON; call done again with {\"summary\": \"...\"}", false, false
		}
		env.Trace("tool_call", map[string]any{"turn": turn, "id": c.ID, "name": name, "arguments": json.RawMessage(args)})
		return "ok", true, true
	case shelltool.Name:
		a, err := shelltool.ParseArgs([]byte(args))
		if err != nil {
			env.Trace("invalid_tool_call", map[string]any{"turn": turn, "id": c.ID, "name": name, "arguments": args, "error": err.Error()})
			return fmt.Sprintf("error: %v. Call %s with a JSON object such as {\"command\": \"ls -l /etc\"}.", err, shelltool.Name), false, false
		}
		t0 := time.Now()
		out := env.Shell(ctx, a)
		f := map[string]any{"turn": turn, "id": c.ID, "name": name, "command": a.Command, "timeout_s": a.Timeout.Seconds(),
			"max_output_size": a.MaxOutputSize, "ms": time.Since(t0).Milliseconds(), "result": out.Text}
		if out.Result != nil {
			f["exit_code"], f["timed_out"] = out.Result.ExitCode, out.Result.TimedOut
		}
		env.Trace("tool_call", f)
		return out.Text, true, false
	}
	env.Trace("invalid_tool_call", map[string]any{"turn": turn, "id": c.ID, "name": name, "arguments": args, "error": "unknown tool"})
	return fmt.Sprintf("error: there is no tool %q; the tools are %s and %s", name, shelltool.Name, DoneTool), false, false
}

func canonicalJSON(s string) string {
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		return "{}"
	}
	return b.String()
}

// chatURL is the endpoint's chat completions URL.
func (o *OpenAI) chatURL() string {
	u := strings.TrimRight(o.Endpoint, "/")
	switch {
	case strings.HasSuffix(u, "/chat/completions"):
		return u
	case strings.HasSuffix(u, "/v1"):
		return u + "/chat/completions"
	}
	return u + "/v1/chat/completions"
}

type chatRequest struct {
	Model    string           `json:"model,omitempty"`
	Messages []Message        `json:"messages"`
	Tools    []map[string]any `json:"tools"`
	Choice   string           `json:"tool_choice"`
	Stream   bool             `json:"stream"`
	Options  *streamOptions   `json:"stream_options,omitempty"`
	Sampling
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// responseMessage is an assistant message as responses carry it: the
// arguments may come as a string (the standard) or, from some servers,
// as an object.
type responseMessage struct {
	Content          *string `json:"content"`
	ReasoningContent string  `json:"reasoning_content"`
	ToolCalls        []struct {
		Index    int    `json:"index"`
		ID       string `json:"id"`
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type chatResponse struct {
	Choices []struct {
		Message responseMessage `json:"message"`
		Delta   responseMessage `json:"delta"`
	} `json:"choices"`
	Usage *Usage `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// argString turns a response's arguments into the string the API
// specifies: a JSON string's value, or an object's text.
func argString(raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s
	}
	if len(bytes.TrimSpace(raw)) == 0 || string(raw) == "null" {
		return ""
	}
	return string(raw)
}

// complete sends the history and returns the assistant's message,
// retrying connection errors and 5xx answers.
func (o *OpenAI) complete(ctx context.Context, msgs []Message) (Message, Usage, error) {
	req := chatRequest{Model: o.Model, Messages: msgs, Tools: Tools(), Choice: "auto", Stream: o.Stream, Sampling: o.Sampling}
	if o.Stream {
		req.Options = &streamOptions{IncludeUsage: true}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return Message{}, Usage{}, err
	}
	retries := o.Retries
	if retries == 0 {
		retries = 2
	}
	var lastErr error
	for attempt := 0; attempt <= retries; attempt++ {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return Message{}, Usage{}, ctx.Err()
			case <-time.After(time.Duration(attempt) * time.Second):
			}
		}
		m, u, retry, err := o.post(ctx, body)
		if err == nil {
			return m, u, nil
		}
		lastErr = err
		if !retry || ctx.Err() != nil {
			break
		}
	}
	return Message{}, Usage{}, lastErr
}

func (o *OpenAI) post(ctx context.Context, body []byte) (Message, Usage, bool, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, o.chatURL(), bytes.NewReader(body))
	if err != nil {
		return Message{}, Usage{}, false, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	if o.APIKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+o.APIKey)
	}
	hc := o.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(hreq)
	if err != nil {
		return Message{}, Usage{}, true, fmt.Errorf("chat completions: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		return Message{}, Usage{}, resp.StatusCode >= 500, fmt.Errorf("chat completions: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	var m Message
	var u Usage
	if o.Stream {
		m, u, err = readStream(resp.Body)
	} else {
		m, u, err = readResponse(resp.Body)
	}
	if err != nil {
		return Message{}, Usage{}, false, fmt.Errorf("chat completions: %w", err)
	}
	return m, u, false, nil
}

func readResponse(r io.Reader) (Message, Usage, error) {
	var cr chatResponse
	if err := json.NewDecoder(io.LimitReader(r, 16<<20)).Decode(&cr); err != nil {
		return Message{}, Usage{}, fmt.Errorf("bad response: %w", err)
	}
	if cr.Error != nil {
		return Message{}, Usage{}, errors.New(cr.Error.Message)
	}
	if len(cr.Choices) == 0 {
		return Message{}, Usage{}, errors.New("response has no choices")
	}
	rm := cr.Choices[0].Message
	m := Message{Role: "assistant", Content: rm.Content, ReasoningContent: rm.ReasoningContent}
	for _, tc := range rm.ToolCalls {
		var c ToolCall
		c.ID, c.Type = tc.ID, "function"
		c.Function.Name, c.Function.Arguments = tc.Function.Name, argString(tc.Function.Arguments)
		m.ToolCalls = append(m.ToolCalls, c)
	}
	var u Usage
	if cr.Usage != nil {
		u = *cr.Usage
	}
	return m, u, nil
}

// readStream assembles a server-sent-events response: content, reasoning
// and tool calls arrive in deltas (a call's id and name once, its
// arguments in pieces, keyed by index).
func readStream(r io.Reader) (Message, Usage, error) {
	sc := bufio.NewScanner(io.LimitReader(r, 64<<20))
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var content, reasoning strings.Builder
	sawContent := false
	type acc struct {
		id, name string
		args     strings.Builder
	}
	var calls []*acc
	var u Usage
	finished := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue
		}
		data := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if data == "[DONE]" {
			finished = true
			break
		}
		var cr chatResponse
		if err := json.Unmarshal([]byte(data), &cr); err != nil {
			return Message{}, Usage{}, fmt.Errorf("bad stream chunk %.200q: %w", data, err)
		}
		if cr.Error != nil {
			return Message{}, Usage{}, errors.New(cr.Error.Message)
		}
		if cr.Usage != nil {
			u = *cr.Usage
		}
		if len(cr.Choices) == 0 {
			continue
		}
		d := cr.Choices[0].Delta
		if d.Content != nil {
			sawContent = true
			content.WriteString(*d.Content)
		}
		reasoning.WriteString(d.ReasoningContent)
		for _, tc := range d.ToolCalls {
			if tc.Index < 0 || tc.Index > 64 {
				return Message{}, Usage{}, fmt.Errorf("bad tool call index %d", tc.Index)
			}
			for len(calls) <= tc.Index {
				calls = append(calls, &acc{})
			}
			a := calls[tc.Index]
			if tc.ID != "" {
				a.id = tc.ID
			}
			a.name += tc.Function.Name
			a.args.WriteString(argString(tc.Function.Arguments))
		}
	}
	if err := sc.Err(); err != nil {
		return Message{}, Usage{}, fmt.Errorf("reading stream: %w", err)
	}
	if !finished {
		return Message{}, Usage{}, errors.New("stream ended without [DONE]")
	}
	m := Message{Role: "assistant", ReasoningContent: reasoning.String()}
	if sawContent {
		m.Content = strPtr(content.String())
	}
	for _, a := range calls {
		var c ToolCall
		c.ID, c.Type = a.id, "function"
		c.Function.Name, c.Function.Arguments = a.name, a.args.String()
		m.ToolCalls = append(m.ToolCalls, c)
	}
	return m, u, nil
}
