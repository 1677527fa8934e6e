package agentbench

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
)

// fakeEnv records the commands an agent runs and answers them from a table.
type fakeEnv struct {
	commands []string
	answers  map[string]string
	events   []string
}

func (f *fakeEnv) env(maxTurns int) *Env {
	return &Env{Instruction: "the site is down", MaxTurns: maxTurns,
		Shell: func(_ context.Context, a shelltool.Args) shelltool.Outcome {
			f.commands = append(f.commands, a.Command)
			out := f.answers[a.Command]
			return shelltool.Outcome{Text: shelltool.Format([]byte(out), false, 0, false), Result: &wire.Result{}}
		},
		Trace: func(kind string, _ map[string]any) { f.events = append(f.events, kind) }}
}

func TestOpenAI_Loop(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "json", true: "stream"}[stream], func(t *testing.T) {
			srv := newScripted(t, []scriptedTurn{
				// A Hermes-style call written as text, with reasoning.
				{Reasoning: "Look at the files first.", Content: `Let me check.
<tool_call>{"name": "exec_shell_command", "arguments": {"command": "ls /var/www"}}</tool_call>`},
				// Malformed arguments: counted, answered with an error, never replayed.
				{Check: expectTool("html"), Calls: []rawTC{{Name: "exec_shell_command", Args: `{"command": "cat /etc/x"`}}},
				// An unknown tool, and a proper call in the same turn.
				{Check: expectTool("not a JSON object"), Content: "<think>two calls</think>",
					Calls: []rawTC{{Name: "read_file", Args: `{"path":"/x"}`}, {Name: "exec_shell_command", Args: `{"command":"fix","timeout":"20"}`}}},
				// A bare JSON object in a code fence, naming a known tool.
				{Check: expectTool("[exit code: 0]"), Content: "```json\n{\"name\": \"exec_shell_command\", \"parameters\": {\"command\": \"verify\"}}\n```"},
				{Check: expectTool("all good"), Calls: []rawTC{{Name: "done", Args: `{"summary":"fixed"}`}}},
			})
			fe := &fakeEnv{answers: map[string]string{"ls /var/www": "html\n", "verify": "all good\n"}}
			o := &OpenAI{Endpoint: srv.URL, Model: "m", Stream: stream}
			r := o.Run(context.Background(), fe.env(10))
			want := AgentResult{Stop: StopDone, Turns: 5, ToolCalls: 6, InvalidToolCalls: 2, TextToolCalls: 2, PromptTokens: 500, CompletionTokens: 50}
			if r != want {
				t.Errorf("result %+v, want %+v", r, want)
			}
			if !slices.Equal(fe.commands, []string{"ls /var/www", "fix", "verify"}) {
				t.Errorf("commands %q", fe.commands)
			}
			reqs := srv.requests()
			if len(reqs) != 5 {
				t.Fatalf("%d requests", len(reqs))
			}
			// The text call went back as a proper call, its text removed.
			a := reqs[1][2]
			if a.Role != "assistant" || len(a.ToolCalls) != 1 || a.ToolCalls[0].Function.Name != "exec_shell_command" ||
				*a.Content != "Let me check." {
				t.Errorf("replayed text call: %+v", a)
			}
			// The malformed call went back with {} arguments.
			if b := reqs[2][4]; b.ToolCalls[0].Function.Arguments != "{}" {
				t.Errorf("malformed arguments replayed as %q", b.ToolCalls[0].Function.Arguments)
			}
		})
	}
}

func TestOpenAI_StopsAndLimits(t *testing.T) {
	// A text answer ends the run.
	srv := newScripted(t, []scriptedTurn{{Content: "I cannot help with that."}})
	r := (&OpenAI{Endpoint: srv.URL + "/v1"}).Run(context.Background(), (&fakeEnv{}).env(5))
	if r.Stop != StopStopped || r.Turns != 1 {
		t.Errorf("text answer: %+v", r)
	}
	// Turns run out.
	loop := scriptedTurn{Calls: []rawTC{{Name: "exec_shell_command", Args: `{"command":"true"}`}}}
	srv = newScripted(t, []scriptedTurn{loop, loop, loop})
	r = (&OpenAI{Endpoint: srv.URL}).Run(context.Background(), (&fakeEnv{}).env(2))
	if r.Stop != StopTurns || r.Turns != 2 || r.ToolCalls != 2 {
		t.Errorf("turns: %+v", r)
	}
	// The endpoint fails: an agent error after retries.
	srv = newScripted(t, nil)
	r = (&OpenAI{Endpoint: srv.URL, Retries: 1}).Run(context.Background(), (&fakeEnv{}).env(5))
	if r.Stop != StopError || !strings.Contains(r.Err, "500") {
		t.Errorf("server error: %+v", r)
	}
	// The time limit.
	ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
	defer cancel()
	<-ctx.Done()
	r = (&OpenAI{Endpoint: srv.URL}).Run(ctx, (&fakeEnv{}).env(5))
	if r.Stop != StopTimeout {
		t.Errorf("deadline: %+v", r)
	}
}

func TestTextToolCalls(t *testing.T) {
	known := []string{"exec_shell_command", "done"}
	for _, tc := range []struct {
		in       string
		names    []string
		args     []string
		rest     string
		unparsed bool
	}{
		{`<tool_call>{"name":"exec_shell_command","arguments":{"command":"ls"}}</tool_call>`, []string{"exec_shell_command"}, []string{`{"command":"ls"}`}, "", false},
		{"ok\n<tool_call>\n{\"name\": \"done\", \"arguments\": {}}\n</tool_call>\n", []string{"done"}, []string{`{}`}, "ok", false},
		{`<tool_call>{"name":"exec_shell_command","arguments":{"command":"ls"}</tool_call>`, []string{"exec_shell_command"}, nil, "", true},
		{"```json\n{\"name\":\"exec_shell_command\",\"arguments\":\"{\\\"command\\\":\\\"id\\\"}\"}\n```", []string{"exec_shell_command"}, []string{`{"command":"id"}`}, "", false},
		{`[{"name":"exec_shell_command","arguments":{"command":"a"}},{"name":"done"}]`, []string{"exec_shell_command", "done"}, []string{`{"command":"a"}`, `{}`}, "", false},
		{`{"function":{"name":"exec_shell_command","arguments":{"command":"b"}}} then`, []string{"exec_shell_command"}, []string{`{"command":"b"}`}, "then", false},
		{`{"tool":"exec_shell_command","args":{"command":"c"}}`, []string{"exec_shell_command"}, []string{`{"command":"c"}`}, "", false},
		{`The config is {"name": "web", "port": 80}.`, nil, nil, `The config is {"name": "web", "port": 80}.`, false},
		{`{"name":"rm_rf","arguments":{}}`, nil, nil, `{"name":"rm_rf","arguments":{}}`, false},
		{`no calls here {`, nil, nil, `no calls here {`, false},
		{`<b>&</b> {"name":"exec_shell_command","arguments":{"command":"a<b"}}`, []string{"exec_shell_command"}, []string{`{"command":"a<b"}`}, "<b>&</b>", false},
	} {
		calls, rest := TextToolCalls(tc.in, known)
		var names, args []string
		for _, c := range calls {
			names = append(names, c.Function.Name)
			if json.Valid([]byte(c.Function.Arguments)) {
				args = append(args, c.Function.Arguments)
			}
		}
		if !slices.Equal(names, tc.names) || !slices.Equal(args, tc.args) || rest != tc.rest {
			t.Errorf("%q:\n got %q %q rest %q\nwant %q %q rest %q", tc.in, names, args, rest, tc.names, tc.args, tc.rest)
		}
		if tc.unparsed && (len(calls) != 1 || json.Valid([]byte(calls[0].Function.Arguments))) {
			t.Errorf("%q: a broken <tool_call> must come back as one invalid call, got %+v", tc.in, calls)
		}
	}
}

func TestSplitThink(t *testing.T) {
	for _, tc := range []struct{ in, rest, think string }{
		{"<think>a</think>b", "b", "a"},
		{"x<think>a</think>y<think>c</think>", "xy", "a\nc"},
		{"plan</think>answer", "answer", "plan"},
		{"plain", "plain", ""},
	} {
		rest, think := splitThink(tc.in)
		if rest != tc.rest || think != tc.think {
			t.Errorf("splitThink(%q) = %q, %q", tc.in, rest, think)
		}
	}
}

func TestChatURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://h:8080":                  "http://h:8080/v1/chat/completions",
		"http://h:8080/":                 "http://h:8080/v1/chat/completions",
		"http://h:8080/v1":               "http://h:8080/v1/chat/completions",
		"http://h/x/v1/chat/completions": "http://h/x/v1/chat/completions",
	} {
		if got := (&OpenAI{Endpoint: in}).chatURL(); got != want {
			t.Errorf("%s → %s, want %s", in, got, want)
		}
	}
}

func TestReadStreamErrors(t *testing.T) {
	for _, in := range []string{
		"data: {\"choices\":[]}\n\n",                 // no [DONE]
		"data: {not json}\n\ndata: [DONE]\n\n",       // broken chunk
		"data: {\"error\":{\"message\":\"boom\"}}\n", // an error chunk
		"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1000}]}}]}\n",
	} {
		if _, _, err := readStream(strings.NewReader(in)); err == nil {
			t.Errorf("%q: no error", in)
		}
	}
}

func TestWilsonAndPassAtK(t *testing.T) {
	for _, tc := range []struct {
		k, n   int
		lo, hi float64
	}{{0, 10, 0, 0.2775}, {10, 10, 0.7225, 1}, {5, 10, 0.2366, 0.7634}, {1, 1, 0.2065, 1}, {0, 0, 0, 1}} {
		if got := Wilson(tc.k, tc.n); math.Abs(got.Lo-tc.lo) > 1e-4 || math.Abs(got.Hi-tc.hi) > 1e-4 {
			t.Errorf("Wilson(%d, %d) = %+v, want %v–%v", tc.k, tc.n, got, tc.lo, tc.hi)
		}
	}
	for _, tc := range []struct {
		n, c, k int
		want    float64
	}{{5, 0, 1, 0}, {5, 5, 1, 1}, {5, 1, 1, 0.2}, {5, 1, 5, 1}, {10, 3, 2, 0.5333}, {4, 2, 3, 1}} {
		if got := PassAtK(tc.n, tc.c, tc.k); math.Abs(got-tc.want) > 1e-4 {
			t.Errorf("PassAtK(%d, %d, %d) = %v, want %v", tc.n, tc.c, tc.k, got, tc.want)
		}
	}
}

func TestSummarizeAndReport(t *testing.T) {
	ttf := func(x float64) *float64 { return &x }
	results := []TrialResult{
		{Scenario: "a", Run: 1, Agent: "openai", Resolved: true, TimeToFix: ttf(10), AgentResult: AgentResult{Turns: 3}, Trace: "traces/a-run1.jsonl"},
		{Scenario: "a", Run: 2, Agent: "openai", Resolved: false, FailureMode: FailTurns, AgentResult: AgentResult{Turns: 30}, Trace: "traces/a-run2.jsonl"},
		{Scenario: "b", Run: 1, Agent: "openai", Resolved: true, TimeToFix: ttf(30), AgentResult: AgentResult{Turns: 5}, Trace: "traces/b-run1.jsonl"},
		{Scenario: "b", Run: 2, Agent: "openai", Resolved: true, TimeToFix: ttf(50), AgentResult: AgentResult{Turns: 7}, Trace: "traces/b-run2.jsonl",
			Checks: []CheckResult{{Phase: "guard", Name: "<ssh>", OK: false, Detail: "x"}}, Receipts: "receipts/b-run2", ReceiptCount: 9},
	}
	s := Summarize(results)
	if s.Trials != 4 || s.Resolved != 3 || s.K != 2 || s.PassRate != 0.75 || *s.MedianTTF != 30 || s.PassAtK != 1 {
		t.Errorf("summary %+v", s)
	}
	if a := s.Scenarios[0]; a.ID != "a" || a.PassRate != 0.5 || a.FailureModes[FailTurns] != 1 || *a.MedianTurns != 16.5 || *a.MedianTTF != 10 {
		t.Errorf("scenario a: %+v", a)
	}
	dir := t.TempDir()
	if err := WriteReport(dir, s, results); err != nil {
		t.Fatal(err)
	}
	page, _ := os.ReadFile(filepath.Join(dir, "report.html"))
	for _, want := range []string{"<svg", `href="traces/b-run2.jsonl"`, "3 of 4", "&lt;ssh&gt;", "pass@2", `<a href="receipts/b-run2/">9</a>`, "vmgated receipt verify"} {
		if !strings.Contains(string(page), want) {
			t.Errorf("report.html lacks %q", want)
		}
	}
	for _, bad := range []string{"<script", "http://", "https://", "<ssh>"} {
		if strings.Contains(string(page), bad) {
			t.Errorf("report.html contains %q", bad)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "report.md"))
	if !strings.Contains(string(md), "| a | 1 | yes |") || !strings.Contains(string(md), "| [9](receipts/b-run2/) |") {
		t.Errorf("report.md:\n%s", md)
	}
}

func TestParseChecks(t *testing.T) {
	out := "noise\nPASS site up\nFAIL guard x: went away\nPASS y\n"
	cs, ok := ParseChecks("guard", out, 1)
	if ok || len(cs) != 3 || cs[1].OK || cs[1].Name != "guard x" || cs[1].Detail != "went away" {
		t.Errorf("%+v %v", cs, ok)
	}
	if cs, ok := ParseChecks("check", "", 0); !ok || len(cs) != 1 || !cs[0].OK {
		t.Errorf("silent success: %+v", cs)
	}
	if cs, ok := ParseChecks("check", "PASS a\n", 2); ok || len(cs) != 2 || cs[1].OK {
		t.Errorf("non-zero exit without FAIL: %+v", cs)
	}
}

func TestParseScenario(t *testing.T) {
	good := `id = "x-1"
title = "T"
category = "service"
difficulty = "easy"
instruction = "fix it"
protect = ["/etc/a.conf"]
`
	s, err := ParseScenario([]byte(good))
	if err != nil || s.MaxTurns != 30 || s.AgentLimit != 10*time.Minute || s.Network != "none" || s.Settle != 2*time.Second {
		t.Fatalf("%+v %v", s, err)
	}
	for _, tc := range []struct{ edit, want string }{
		{`id = "X"`, "id"},
		{`difficulty = "trivial"`, "difficulty"},
		{`max_turns = 0` + "\nmax_turns = 1", "already been defined"},
		{`settle_time = "forever"`, "settle_time"},
		{`network = "allowlist"`, "network"},
		{`protect = ["etc/a"]`, "protect"},
		{`protect = ["/etc/../x"]`, "protect"},
		{`color = "red"`, "unknown keys: color"},
		{`instruction = ""`, "instruction"},
	} {
		_, err := ParseScenario([]byte(good + tc.edit + "\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.edit, err, tc.want)
		}
	}
}

// TestShippedScenarios checks every scenario in the repository loads and
// follows the rules of docs/scenarios.md.
func TestShippedScenarios(t *testing.T) {
	scs, err := LoadScenarios("../../../scenarios", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(scs) < 15 {
		t.Errorf("%d scenarios, want at least 15", len(scs))
	}
	cats := map[string]bool{}
	for _, s := range scs {
		cats[s.Category] = true
		for name, text := range map[string][]byte{"check": s.Check, "guards": s.Guards} {
			if !strings.Contains(string(text), "\nfinish") {
				t.Errorf("%s: %s.sh does not end with finish", s.ID, name)
			}
		}
		// Instructions state symptoms; a spot check that none names the
		// tool of its fix.
		for _, word := range []string{"chmod", "iptables", "nsswitch", "crlf", "strictmodes", "lsof", "unmask"} {
			if strings.Contains(strings.ToLower(s.Instruction), word) {
				t.Errorf("%s: the instruction names the fix (%q)", s.ID, word)
			}
		}
	}
	if len(cats) < 8 {
		t.Errorf("only %d categories", len(cats))
	}
}

func FuzzTextToolCalls(f *testing.F) {
	for _, s := range []string{`<tool_call>{"name":"done"}</tool_call>`, "```json\n{\"name\":\"done\"}\n```", `[{"name":"done"}]`, `{{{`, `<tool_call>`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		calls, rest := TextToolCalls(s, []string{"exec_shell_command", "done"})
		if len(calls) == 0 && rest != s {
			t.Fatalf("no calls but content changed: %q → %q", s, rest)
		}
		if len(rest) > len(s) {
			t.Fatalf("rest longer than input")
		}
	})
}

func FuzzParseScenario(f *testing.F) {
	f.Add([]byte("id = \"a\"\ntitle = \"t\"\ncategory = \"c\"\ndifficulty = \"easy\"\ninstruction = \"i\"\n"))
	f.Add([]byte("protect = [\"/x\"]\nsettle_time = \"1s\""))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseScenario(b)
		if err == nil && (s.MaxTurns < 1 || s.Network != "none" || !idRE.MatchString(s.ID)) {
			t.Fatalf("accepted invalid scenario %+v", s)
		}
	})
}

func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n")
	f.Add("data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"x\",\"function\":{\"name\":\"done\",\"arguments\":\"{}\"}}]}}]}\ndata: [DONE]\n")
	f.Fuzz(func(t *testing.T, s string) {
		_, _, _ = readStream(strings.NewReader(s))
	})
}
