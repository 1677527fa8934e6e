package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/vmgate/vmgate/cmd/vmgated/agentbench"
	"github.com/vmgate/vmgate/internal/testutil"
)

// TestBenchAgent_OracleAndNoop is the benchmark's own test suite: through
// the real binary, every shipped scenario is resolved by its reference
// fix (the oracle) and not resolved by doing nothing (noop) — a scenario
// that fails either is broken, not hard. The oracle runs best-of-2 with
// --fork: each scenario's fault is injected once and the broken VM forked
// into one copy per run, so every scenario's checks are shown to hold on
// forks, not only on the fresh VM it was injected in. Then the report
// renders.
func TestBenchAgent_OracleAndNoop(t *testing.T) {
	img := testutil.RequiresImage(t)
	bin := binary(t, "vmgated")
	state, templates := t.TempDir(), testutil.TemplateDir(t)
	scenarios, err := agentbench.LoadScenarios("../../../scenarios", nil)
	if err != nil {
		t.Fatal(err)
	}
	outs := map[string]string{"oracle": filepath.Join(t.TempDir(), "oracle"), "noop": filepath.Join(t.TempDir(), "noop")}
	var wg sync.WaitGroup
	for agent, out := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"bench", "agent", "--agent", agent, "--scenarios", "../../../scenarios",
				"--image", img, "--state-dir", state, "--template-dir", templates, "--parallel", map[string]string{"oracle": "2", "noop": "1"}[agent], "--out", out}
			if agent == "oracle" {
				args = append(args, "--fork", "--runs", "2")
			}
			_, se, code := runCmd(t, nil, bin, args...)
			if code != 0 {
				t.Errorf("%s: exit %d\n%s", agent, code, se)
			}
			t.Logf("%s:\n%s", agent, se)
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for agent, out := range outs {
		results, err := agentbench.ReadResults(out)
		if err != nil {
			t.Fatal(err)
		}
		runs := map[string]int{"oracle": 2, "noop": 1}[agent]
		if len(results) != runs*len(scenarios) {
			t.Errorf("%s: %d results for %d scenarios, %d runs each", agent, len(results), len(scenarios), runs)
		}
		for _, r := range results {
			if r.FailureMode == agentbench.FailHarness {
				t.Errorf("%s %s: harness error: %s", agent, r.Scenario, r.Error)
				continue
			}
			if want := agent == "oracle"; r.Resolved != want {
				t.Errorf("%s %s: resolved=%v, want %v (failure %s, checks %+v)", agent, r.Scenario, r.Resolved, want, r.FailureMode, r.Checks)
			}
			if agent == "noop" && (r.CheckPassed || !r.GuardsPassed) {
				t.Errorf("noop %s: check passed %v, guards passed %v: %+v", r.Scenario, r.CheckPassed, r.GuardsPassed, r.Checks)
			}
			if forked := r.ForkedFrom != ""; forked != (agent == "oracle") {
				t.Errorf("%s %s run %d: forked from %q", agent, r.Scenario, r.Run, r.ForkedFrom)
			}
			if _, err := os.Stat(filepath.Join(out, r.Trace)); err != nil {
				t.Errorf("%s %s: trace: %v", agent, r.Scenario, err)
			}
		}
	}
	// The summary says what each fork cost beside injecting k times.
	var sum agentbench.Summary
	if err := json.Unmarshal([]byte(testutil.ReadFile(t, filepath.Join(outs["oracle"], "summary.json"))), &sum); err != nil {
		t.Fatal(err)
	}
	if sum.K != 2 || len(sum.Forks) != len(scenarios) {
		t.Errorf("oracle summary: k %d, %d fork summaries for %d scenarios", sum.K, len(sum.Forks), len(scenarios))
	}
	for _, f := range sum.Forks {
		if f.Copies != 2 || f.InjectSeconds <= 0 || f.ForkSeconds <= 0 {
			t.Errorf("fork summary %+v", f)
		}
	}
	// The audit log of the run's daemon was kept with the results and
	// holds the trials' commands.
	audit, err := os.ReadFile(filepath.Join(outs["oracle"], "audit.jsonl"))
	if err != nil || !strings.Contains(string(audit), `"bash","-s"`) {
		t.Errorf("audit log: %v, %d bytes", err, len(audit))
	}
	// Every command of every trial has a receipt, and the run's receipts
	// check against its key and audit log.
	for agent, out := range outs {
		so, se, code := runCmd(t, nil, bin, "receipt", "verify", out, "--key", filepath.Join(out, agentbench.ReceiptKeyFile), "--audit", filepath.Join(out, "audit.jsonl"))
		if code != 0 || !strings.Contains(so, ": valid:") {
			t.Errorf("%s: receipt verify: exit %d\n%s%s", agent, code, so, se)
		}
	}
	// bench report renders a finished run again.
	so, se, code := runCmd(t, nil, bin, "bench", "report", outs["oracle"])
	if code != 0 || !strings.Contains(so, "100 %") {
		t.Fatalf("bench report: exit %d\n%s\n%s", code, so, se)
	}
	page, err := os.ReadFile(filepath.Join(outs["oracle"], "report.html"))
	if err != nil || !strings.Contains(string(page), "<svg") || !strings.Contains(string(page), `href="traces/`) {
		t.Errorf("report.html: %v", err)
	}
	// A second run into the same directory is refused: results are never
	// overwritten.
	_, se, code = runCmd(t, nil, bin, "bench", "agent", "--agent", "noop", "--scenarios", "../../../scenarios", "--only", "cpu-hog",
		"--image", img, "--state-dir", state, "--out", outs["noop"])
	if code == 0 || !strings.Contains(se, "new --out") {
		t.Errorf("rerun into the same --out: exit %d: %s", code, se)
	}
}
