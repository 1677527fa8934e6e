package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/wire"

	"github.com/vmgate/vmgate/cmd/vmgated/bench"
	"github.com/vmgate/vmgate/internal/testutil"
)

// TestBenchExec runs a short exec benchmark through the real binary and
// checks that every figure was measured (not that it is fast).
func TestBenchExec(t *testing.T) {
	img := testutil.RequiresImage(t)
	bin := binary(t, "vmgated")
	state := t.TempDir()
	so, se, code := runCmd(t, nil, bin, "bench", "exec", "--image", img, "--state-dir", state,
		"--template-dir", testutil.TemplateDir(t), "--runs", "2", "--cold-runs", "1", "--concurrency", "1,2", "--pool", "1", "--session-mib", "4", "--fork-idle", "2", "--json")
	if code != 0 {
		t.Fatalf("exit %d\nstderr: %s", code, se)
	}
	var r bench.ExecReport
	if err := json.Unmarshal([]byte(so), &r); err != nil {
		t.Fatalf("%v\n%s", err, so)
	}
	t.Logf("%s", so)
	for name, s := range map[string]bench.Stat{
		"cold_boot_ms": r.ColdBootMS, "restore_ms": r.RestoreMS, "restore_first_exec_ms": r.RestoreFirstMS,
		"oneshot_pool_ms": r.OneshotPoolMS, "oneshot_nopool_ms": r.OneshotNoPoolMS, "session_exec_ms": r.SessionExecMS,
		"oneshot_net_pool_ms": r.OneshotNetPoolMS, "oneshot_net_nopool_ms": r.OneshotNetNoPoolMS,
		"restore_ahead_ms": r.RestoreAheadMS, "restore_ahead_first_exec_ms": r.RestoreAheadFirstMS,
		"pause_ms": r.PauseMS, "resume_ms": r.ResumeMS, "fork_ms": r.ForkMS, "fork4_ms": r.Fork4MS,
		"secret_https_ms": r.SecretHTTPSMS, "https_ms": r.HTTPSMS,
	} {
		want := 2
		if name == "cold_boot_ms" {
			want = 1
		}
		if s.N != want || s.P50 <= 0 || s.P95 < s.P50 || s.Min > s.P50 || s.Max < s.P95 {
			t.Errorf("%s: %+v", name, s)
		}
	}
	for _, p := range []string{"overlay", "launch", "qemu_up", "load_state", "agent", "refresh"} {
		if r.RestorePhasesMS[p].N != 2 {
			t.Errorf("restore phase %s missing: %+v", p, r.RestorePhasesMS)
		}
	}
	// A clone launched ahead is timed from its completion: QEMU is up.
	for _, p := range []string{"load_state", "agent", "refresh"} {
		if r.RestoreAheadPhasesMS[p].N != 2 {
			t.Errorf("phase %s of a restore launched ahead missing: %+v", p, r.RestoreAheadPhasesMS)
		}
	}
	if _, ok := r.RestoreAheadPhasesMS["qemu_up"]; ok {
		t.Errorf("a restore launched ahead timed QEMU's start-up: %+v", r.RestoreAheadPhasesMS)
	}
	// The paused session: its RAM's data and its disk's changes, at most
	// the RAM plus those; two idle copies sharing their fork point.
	if r.PausedDiskMiB <= 4 || r.PausedDiskMiB > 512+4+64 || r.ForkIdle.VMs != 2 || r.ForkIdlePSS <= 0 || r.ForkIdlePSS >= r.ForkIdle.RSSMiB {
		t.Errorf("sessions: paused %.1f MiB, fork idle %+v (PSS %.1f)", r.PausedDiskMiB, r.ForkIdle, r.ForkIdlePSS)
	}
	if r.IdleAhead.RSSMiB <= 0 || r.Levers["ahead"] == nil || r.Levers["agent_protocol"] == nil {
		t.Errorf("clone launched ahead: memory %+v, levers %v", r.IdleAhead, r.Levers)
	}
	if len(r.Throughput) != 2 || r.Throughput[1].Concurrency != 2 || r.Throughput[1].PerMinute <= 0 || r.Throughput[0].Commands < 2 {
		t.Errorf("throughput: %+v", r.Throughput)
	}
	// Receipts: the same commands without and with, in pairs; the
	// overhead's budget is the report's to flag (a note), not this
	// test's: under TCG one pair's noise exceeds it.
	if r.SessionNoReceiptMS.N != 30 || r.SessionReceiptMS.N != 30 || r.RefusalNoReceiptMS.N != 30 || r.RefusalReceiptMS.P50 <= 0 || !strings.Contains(so, `"receipt_overhead_ms"`) {
		t.Errorf("receipt overhead: %+v %+v %+v %+v %v", r.RefusalNoReceiptMS, r.RefusalReceiptMS, r.SessionNoReceiptMS, r.SessionReceiptMS, r.ReceiptOverheadMS)
	}
	if r.RestoreHandshakeFailures != 0 {
		t.Errorf("%d restores failed their first agent handshake", r.RestoreHandshakeFailures)
	}
	if !strings.Contains(so, `"restore_handshake_failures": 0`) {
		t.Errorf("the JSON report lacks restore_handshake_failures")
	}
	if r.IdleRestored.PSSMiB <= 0 || r.IdleRestored.RSSMiB < r.IdleRestored.PSSMiB || r.IdleCold.PSSMiB <= 0 {
		t.Errorf("memory: %+v %+v", r.IdleRestored, r.IdleCold)
	}
	if r.Ratios["cold_over_oneshot_pool"] <= 0 || r.Machine.CPUs <= 0 || r.Machine.QEMU == "" || r.Machine.Accel == "" {
		t.Errorf("ratios/machine: %+v %+v", r.Ratios, r.Machine)
	}
	// The scratch state is gone; the templates stay for the next run.
	ents, _ := os.ReadDir(state)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "bench-") {
			t.Errorf("scratch directory left: %s", filepath.Join(state, e.Name()))
		}
	}
	// The saved JSON renders as the text table.
	saved := filepath.Join(t.TempDir(), "r.json")
	if err := os.WriteFile(saved, []byte(so), 0o600); err != nil {
		t.Fatal(err)
	}
	text, se, code := runCmd(t, nil, bin, "bench", "exec", "--report", saved)
	if code != 0 || !strings.Contains(text, "one-shot `true` via daemon, warm pool") || !strings.Contains(text, "throughput at concurrency 2") {
		t.Errorf("--report: exit %d\n%s\n%s", code, text, se)
	}
	_, se, code = runCmd(t, nil, bin, "bench", "exec", "--image", img, "--runs", "0")
	if code != wire.ExitUsage || !strings.Contains(se, "at least 1") {
		t.Errorf("--runs 0: exit %d, %q", code, se)
	}
	_, se, code = runCmd(t, nil, bin, "bench", "exec", "--image", img, "--concurrency", "1,x")
	if code != wire.ExitUsage || !strings.Contains(se, "concurrency") {
		t.Errorf("--concurrency 1,x: exit %d, %q", code, se)
	}
}

// TestImageWarm builds or finds the default shape's template.
func TestImageWarm(t *testing.T) {
	img := testutil.RequiresImage(t)
	bin := binary(t, "vmgated")
	tdir := testutil.TemplateDir(t)
	so, se, code := runCmd(t, nil, bin, "image", "warm", "--image", img, "--state-dir", t.TempDir(), "--template-dir", tdir)
	if code != 0 || !strings.Contains(so, "(512 MiB, 1 CPU, ") || !strings.Contains(so, tdir) {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, so, se)
	}
	// Now it is there: a second run only checks it.
	so, se, code = runCmd(t, nil, bin, "image", "warm", "--image", img, "--state-dir", t.TempDir(), "--template-dir", tdir)
	if code != 0 || !strings.Contains(so, "up to date") {
		t.Fatalf("second run: exit %d\nstdout: %s\nstderr: %s", code, so, se)
	}
	// With a policy: every shape it uses, a NIC included.
	pol := filepath.Join(t.TempDir(), "p.toml")
	if err := os.WriteFile(pol, []byte(`version = 1
[[profile]]
name = "plain"
match = { uids = [1] }
[[profile]]
name = "web"
match = { any = true }
[profile.network]
mode = "allowlist"
allow = ["example.com:443"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	so, se, code = runCmd(t, nil, bin, "image", "warm", "--image", img, "--state-dir", t.TempDir(), "--template-dir", tdir, "--config", pol)
	if code != 0 || strings.Count(so, "(512 MiB, 1 CPU, ") != 2 || strings.Count(so, "with a NIC") != 1 {
		t.Fatalf("policy shapes: exit %d\nstdout: %s\nstderr: %s", code, so, se)
	}
	if _, se, code := runCmd(t, nil, bin, "image", "warm", "--config", pol, "--memory", "256"); code != wire.ExitUsage || !strings.Contains(se, "one shape") {
		t.Fatalf("--config with --memory: exit %d, %s", code, se)
	}
	_, se, code = runCmd(t, nil, bin, "image", "warm", "--image", filepath.Join(t.TempDir(), "none"))
	if code == 0 || !strings.Contains(se, "image build") {
		t.Fatalf("missing image: exit %d, %s", code, se)
	}
}
