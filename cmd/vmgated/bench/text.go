package bench

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
)

// phaseOrder is the order VM start phases happen in.
var phaseOrder = []string{"overlay", "launch", "qemu_up", "load_state", "agent", "refresh", "disk", "network"}

// WriteText renders the report as a table for people.
func (r *ExecReport) WriteText(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "vmgate exec benchmark, %s\n", r.When.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "machine: %s, %d CPUs, %d MiB; kernel %s; %s; accel %s; %s\n\n", m.CPUModel, m.CPUs, m.MemTotalMiB, m.Kernel, m.QEMU, m.Accel, m.Cgroups)
	fmt.Fprintf(w, "%-44s %9s %9s %4s\n", "", "p50 ms", "p95 ms", "n")
	row := func(name string, s Stat) {
		fmt.Fprintf(w, "%-44s %9.1f %9.1f %4d\n", name, s.P50, s.P95, s.N)
	}
	row("cold: new overlay + boot + first command", r.ColdBootMS)
	phases(w, r.ColdPhasesMS)
	row("restore: request -> agent ready", r.RestoreMS)
	phases(w, r.RestorePhasesMS)
	row("first command after a restore", r.RestoreFirstMS)
	row("restore of a clone launched ahead", r.RestoreAheadMS)
	phases(w, r.RestoreAheadPhasesMS)
	row("first command after it", r.RestoreAheadFirstMS)
	row("one-shot `true` via daemon, warm pool", r.OneshotPoolMS)
	oneshotParts(w, r.OneshotPoolPartsMS)
	row("one-shot `true` via daemon, no pool", r.OneshotNoPoolMS)
	oneshotParts(w, r.OneshotNoPoolPartsMS)
	row("one-shot, network profile, warm pool", r.OneshotNetPoolMS)
	oneshotParts(w, r.OneshotNetPoolPartsMS)
	row("one-shot, network profile, no pool", r.OneshotNetNoPoolMS)
	oneshotParts(w, r.OneshotNetNoPoolPartsMS)
	row("command in a kept VM (session)", r.SessionExecMS)
	row("pause a session to disk", r.PauseMS)
	row("resume: paused -> first command answered", r.ResumeMS)
	row("fork into 1: -> the copy answered", r.ForkMS)
	row("fork into 4: -> every copy answered", r.Fork4MS)
	row("command in a session beside 3 running", r.SessionConcurrentMS)
	row("background process started (--detach)", r.DetachMS)
	row("logs of a finished process, 64 KiB", r.LogsMS)
	row("e2b: create -> the sandbox answered", r.E2BCreateMS)
	row("  local API: a new session's first command", r.APISessionMS)
	row("e2b: commands.run(\"true\")", r.E2BRunMS)
	row("  local API: a session's command", r.APIRunMS)
	row("e2b: files.write of 1 MiB", r.E2BWrite1MiBMS)
	row("  local API: a file write of 1 MiB", r.APIWrite1MiBMS)
	row("HTTPS request with a secret (intercepted)", r.SecretHTTPSMS)
	row("  the same request without one", r.HTTPSMS)
	fmt.Fprintf(w, "%-44s %9.1f ms (median of the pairs' differences; budget %d)\n", "  what the interception adds", r.SecretOverheadMS, SecretBudgetMS)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "paused session on disk: %.1f MiB; %d idle copies of one fork point: PSS %.1f MiB each (RSS %.1f)\n",
		r.PausedDiskMiB, r.ForkIdle.VMs, r.ForkIdle.PSSMiB, r.ForkIdle.RSSMiB)
	fmt.Fprintln(w)
	row("refused request via daemon, no receipt", r.RefusalNoReceiptMS)
	row("refused request via daemon, with receipt", r.RefusalReceiptMS)
	row("session command via daemon, no receipt", r.SessionNoReceiptMS)
	row("session command via daemon, with receipt", r.SessionReceiptMS)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "receipt_overhead_ms: %.2f per request (median of %d paired differences of refused requests; budget %d ms); beside a session command: %.2f\n",
		r.ReceiptOverheadMS, r.RefusalReceiptMS.N, ReceiptBudgetMS, r.ReceiptOverheadSessionMS)
	fmt.Fprintf(w, "restores whose first agent handshake failed: %d\n", r.RestoreHandshakeFailures)
	for _, t := range r.Throughput {
		fmt.Fprintf(w, "throughput at concurrency %d: %.1f one-shot commands/min (%d in %.1f s, %d from the pool)\n", t.Concurrency, t.PerMinute, t.Commands, t.Seconds, t.FromPool)
	}
	fmt.Fprintf(w, "idle VM, restored: RSS %.1f MiB, PSS %.1f MiB (mean of %d)\n", r.IdleRestored.RSSMiB, r.IdleRestored.PSSMiB, r.IdleRestored.VMs)
	for _, m := range r.IdleRestoredN {
		fmt.Fprintf(w, "  with %d idle: PSS %.1f MiB per VM (RSS %.1f)\n", m.VMs, m.PSSMiB, m.RSSMiB)
	}
	if len(r.Levers) > 0 {
		fmt.Fprintf(w, "levers: %v\n", r.Levers)
	}
	fmt.Fprintf(w, "clone launched ahead, waiting: RSS %.1f MiB, PSS %.1f MiB\n", r.IdleAhead.RSSMiB, r.IdleAhead.PSSMiB)
	fmt.Fprintf(w, "idle VM, cold-booted: RSS %.1f MiB, PSS %.1f MiB\n", r.IdleCold.RSSMiB, r.IdleCold.PSSMiB)
	how := "loaded"
	if r.TemplateBuilt {
		how = "built"
	}
	fmt.Fprintf(w, "template: %s in %.0f ms; %.0f MiB of RAM data shared by its clones\n", how, r.TemplateMS, r.TemplateRAMMiB)
	var ratios []string
	for _, k := range slices.Sorted(maps.Keys(r.Ratios)) {
		ratios = append(ratios, fmt.Sprintf("%s x%.1f", k, r.Ratios[k]))
	}
	fmt.Fprintf(w, "ratios (p50): %s\n", strings.Join(ratios, ", "))
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
}

func oneshotParts(w io.Writer, p map[string]Stat) {
	if len(p) == 0 {
		return
	}
	fmt.Fprintf(w, "  daemon's account (p50 ms): get VM %.0f, exec %.0f, whole request %.0f\n", p["vm"].P50, p["exec"].P50, p["daemon_total"].P50)
}

func phases(w io.Writer, p map[string]Stat) {
	var parts []string
	for _, k := range phaseOrder {
		if s, ok := p[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, s.P50))
		}
	}
	// A phase this list does not know yet is printed too, after them.
	for _, k := range slices.Sorted(maps.Keys(p)) {
		if !slices.Contains(phaseOrder, k) {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, p[k].P50))
		}
	}
	if len(parts) > 0 {
		fmt.Fprintf(w, "  %s\n", "phases (p50 ms): "+strings.Join(parts, ", "))
	}
}
