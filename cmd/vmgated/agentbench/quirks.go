package agentbench

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
)

// Small models served by llama-server do not always use the tool-calling
// format: some write the call as text in the message content (Hermes
// style <tool_call>{…}</tool_call>, a ```json fence, or a bare JSON
// object), some put their thinking in <think> tags in the content instead
// of reasoning_content. These functions recover what the model meant; the
// runner counts such calls separately (text_tool_calls) and replays them
// into the history as proper tool calls.

var (
	thinkRE      = regexp.MustCompile(`(?s)<think>.*?</think>`)
	toolTagRE    = regexp.MustCompile(`(?s)<tool_call>(.*?)</tool_call>`)
	emptyFenceRE = regexp.MustCompile("(?s)```[A-Za-z_]*\\s*```")
	nameRE       = regexp.MustCompile(`"name"\s*:\s*"([^"]{1,64})"`)
)

// splitThink removes <think>…</think> blocks from content and returns the
// rest and the thinking. A closing tag without an opening one (the
// template opened it) makes everything before it thinking.
func splitThink(content string) (rest, think string) {
	var th []string
	rest = thinkRE.ReplaceAllStringFunc(content, func(m string) string {
		th = append(th, strings.TrimSuffix(strings.TrimPrefix(m, "<think>"), "</think>"))
		return ""
	})
	if i := strings.Index(rest, "</think>"); i >= 0 && !strings.Contains(rest[:i], "<think>") {
		th = append(th, rest[:i])
		rest = rest[i+len("</think>"):]
	}
	return strings.TrimSpace(rest), strings.TrimSpace(strings.Join(th, "\n"))
}

// TextToolCalls finds tool calls written as text in content, for the
// tools named in known, and returns them with the content that remains.
// A <tool_call> block that does not parse is returned as a call with
// arguments that are not JSON, so that it counts as an invalid call.
func TextToolCalls(content string, known []string) ([]ToolCall, string) {
	var calls []ToolCall
	rest := toolTagRE.ReplaceAllStringFunc(content, func(m string) string {
		inner := strings.TrimSpace(toolTagRE.FindStringSubmatch(m)[1])
		var v any
		if err := json.Unmarshal([]byte(inner), &v); err == nil {
			if cs := callsFrom(v, nil); len(cs) > 0 {
				calls = append(calls, cs...)
				return ""
			}
		}
		c := ToolCall{Type: "function"}
		c.Function.Name = "unknown"
		if n := nameRE.FindStringSubmatch(inner); n != nil {
			c.Function.Name = n[1]
		}
		c.Function.Arguments = inner
		calls = append(calls, c)
		return ""
	})
	if len(calls) > 0 {
		return calls, tidy(rest)
	}
	// Bare JSON objects (or arrays of them), possibly in a code fence,
	// naming a known tool.
	var out strings.Builder
	i := 0
	for i < len(rest) {
		j := strings.IndexAny(rest[i:], "{[")
		if j < 0 {
			out.WriteString(rest[i:])
			break
		}
		j += i
		dec := json.NewDecoder(strings.NewReader(rest[j:]))
		var v any
		if err := dec.Decode(&v); err == nil {
			if cs := callsFrom(v, known); len(cs) > 0 {
				out.WriteString(rest[i:j])
				calls = append(calls, cs...)
				i = j + int(dec.InputOffset())
				continue
			}
		}
		out.WriteString(rest[i : j+1])
		i = j + 1
	}
	if len(calls) == 0 {
		return nil, content
	}
	return calls, tidy(out.String())
}

func tidy(s string) string { return strings.TrimSpace(emptyFenceRE.ReplaceAllString(s, "")) }

// callsFrom interprets a decoded JSON value as tool calls: an object
// {"name", "arguments"|"parameters"}, {"function": {…}}, {"tool",
// "args"|"arguments"}, or an array of those. known, when not nil, limits
// the names accepted.
func callsFrom(v any, known []string) []ToolCall {
	if arr, ok := v.([]any); ok {
		var out []ToolCall
		for _, e := range arr {
			cs := callsFrom(e, known)
			if len(cs) != 1 {
				return nil
			}
			out = append(out, cs...)
		}
		return out
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	if f, ok := obj["function"].(map[string]any); ok {
		obj = f
	}
	name, _ := obj["name"].(string)
	if name == "" {
		name, _ = obj["tool"].(string)
	}
	if name == "" || (known != nil && !slices.Contains(known, name)) {
		return nil
	}
	var args any = map[string]any{}
	for _, k := range []string{"arguments", "parameters", "args", "input"} {
		if a, ok := obj[k]; ok {
			args = a
			break
		}
	}
	c := ToolCall{Type: "function"}
	c.Function.Name = name
	switch a := args.(type) {
	case string:
		c.Function.Arguments = a
	default:
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(a)
		c.Function.Arguments = strings.TrimSpace(b.String())
	}
	return []ToolCall{c}
}
