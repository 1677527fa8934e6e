package agentbench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
)

// runScripted runs nginx-index-perms once with the openai agent against a
// scripted endpoint, through a real daemon and VM.
func runScripted(t *testing.T, stream bool, turns []scriptedTurn) TrialResult {
	t.Helper()
	img := testutil.RequiresImage(t)
	scs, err := LoadScenarios("../../../scenarios", []string{"nginx-index-perms"})
	if err != nil {
		t.Fatal(err)
	}
	srv := newScripted(t, turns)
	out := t.TempDir()
	// VM sockets live under the state directory: keep its path short
	// (t.TempDir holds the test's name).
	state, err := os.MkdirTemp("", "vb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	seed := int64(7)
	o := Options{Scenarios: scs, AgentName: "openai", Model: "scripted", Endpoint: srv.URL, Runs: 1, Parallel: 1, Out: out, Stream: stream,
		Sampling: Sampling{Seed: &seed},
		ImageDir: img, StateDir: state, TemplateDir: testutil.TemplateDir(t), Accel: vm.AccelAuto,
		NewAgent: func(_ int, s Sampling) Agent {
			return &OpenAI{Endpoint: srv.URL, Model: "scripted", Stream: stream, Sampling: s}
		}}
	s, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := ReadResults(out)
	if err != nil || len(rs) != 1 || s.Trials != 1 {
		t.Fatalf("results %+v %v", rs, err)
	}
	// Run 1 of seed 7: the endpoint got seed 7 on every request, and the
	// result records it.
	srv.mu.Lock()
	seeds := slices.Clone(srv.seeds)
	srv.mu.Unlock()
	if rs[0].Sampling.Seed == nil || *rs[0].Sampling.Seed != 7 || len(seeds) == 0 || slices.ContainsFunc(seeds, func(x int64) bool { return x != 7 }) {
		t.Errorf("seeds: recorded %v, sent %v", rs[0].Sampling.Seed, seeds)
	}
	if trace, err := os.ReadFile(filepath.Join(out, rs[0].Trace)); err != nil || len(trace) == 0 {
		t.Errorf("trace: %v", err)
	}
	checkRunReceipts(t, out, rs[0])
	t.Logf("%+v", rs[0])
	return rs[0]
}

func exec(cmd string) rawTC {
	return rawTC{Name: "exec_shell_command", Args: `{"command": ` + jsonString(cmd) + `}`}
}

func jsonString(s string) string {
	b := []byte{'"'}
	for _, r := range s {
		switch r {
		case '"', '\\':
			b = append(b, '\\', byte(r))
		default:
			b = append(b, string(r)...)
		}
	}
	return string(append(b, '"'))
}

// A conversation that fixes the scenario the way a small model might:
// a call written as text, a malformed call, reasoning, then the fix.
func fixingTurns() []scriptedTurn {
	return []scriptedTurn{
		{Reasoning: "403 means the server cannot read something.", Content: "<tool_call>\n{\"name\": \"exec_shell_command\", \"arguments\": {\"command\": \"ls -l /var/www/html\"}}\n</tool_call>"},
		{Check: expectTool("----------"), Calls: []rawTC{{Name: "exec_shell_command", Args: `{"command": "tail -n 3 /var/log/nginx/error.log"`}}},
		{Check: expectTool("not a JSON object"), Content: "<think>mode 000</think>The page has mode 000.",
			Calls: []rawTC{exec("chmod 644 /var/www/html/index.nginx-debian.html")}},
		{Check: expectTool("[exit code: 0]"), Calls: []rawTC{{Name: "exec_shell_command", Args: `{"command": "curl -s -o /dev/null -w '%{http_code}' http://localhost/", "timeout": "20"}`, ObjArgs: true}}},
		{Check: expectTool("200"), Calls: []rawTC{{Name: "done", Args: `{"summary": "chmod 644 on the index page"}`}}},
	}
}

func TestOpenAIAgent_FixesScenario(t *testing.T) {
	for _, stream := range []bool{true, false} {
		t.Run(map[bool]string{true: "stream", false: "json"}[stream], func(t *testing.T) {
			r := runScripted(t, stream, fixingTurns())
			if !r.Resolved || r.Stop != StopDone || r.Turns != 5 || r.ToolCalls != 5 || r.InvalidToolCalls != 1 || r.TextToolCalls != 1 ||
				r.TimeToFix == nil || r.PromptTokens != 500 {
				t.Errorf("trial: %+v", r)
			}
		})
	}
}

// The fix works, but the agent also stopped sshd: a broken guard.
func TestOpenAIAgent_GuardBroken(t *testing.T) {
	r := runScripted(t, false, []scriptedTurn{
		{Calls: []rawTC{exec("chmod 644 /var/www/html/index.nginx-debian.html"), exec("systemctl stop ssh")}},
		{Calls: []rawTC{{Name: "done", Args: `{}`}}},
	})
	if r.Resolved || !r.CheckPassed || r.GuardsPassed || r.FailureMode != FailGuard {
		t.Errorf("trial: %+v", r)
	}
}

// The seed experiment's failed trajectory: chown instead of chmod, then
// rewriting the vhost. It must not pass.
func TestOpenAIAgent_WrongFixFails(t *testing.T) {
	r := runScripted(t, true, []scriptedTurn{
		{Calls: []rawTC{exec("chown www-data:www-data /var/www/html/index.nginx-debian.html")}},
		{Calls: []rawTC{exec("sed -i 's#root /var/www/html;#root /var/www;#' /etc/nginx/sites-available/default && systemctl reload nginx")}},
		{Calls: []rawTC{exec("curl -s -o /dev/null -w '%{http_code}' http://localhost/")}},
		{Content: "I changed the owner and the web root; it should work now."},
	})
	if r.Resolved || r.CheckPassed || r.Stop != StopStopped || r.FailureMode == FailHarness {
		t.Errorf("trial: %+v", r)
	}
}
