package cli

import (
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
// that fails either is broken, not hard. Then the report renders.
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
			_, se, code := runCmd(t, nil, bin, "bench", "agent", "--agent", agent, "--scenarios", "../../../scenarios",
				"--image", img, "--state-dir", state, "--template-dir", templates, "--parallel", map[string]string{"oracle": "2", "noop": "1"}[agent], "--out", out)
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
		if len(results) != len(scenarios) {
			t.Errorf("%s: %d results for %d scenarios", agent, len(results), len(scenarios))
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
			if _, err := os.Stat(filepath.Join(out, r.Trace)); err != nil {
				t.Errorf("%s %s: trace: %v", agent, r.Scenario, err)
			}
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
