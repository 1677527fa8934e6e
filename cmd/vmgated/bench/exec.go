// Package bench measures vmgate. Exec measures the exec path: how long a
// fresh VM takes to become usable by each route (cold boot, restore from a
// template, the warm pool, through the daemon or not), how many one-shot
// commands a minute the daemon runs, and what an idle VM costs in memory.
// Every figure is measured in the same run, on the same image and host,
// beside the cold-boot baseline, and reported with the machine.
package bench

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/vm"
)

// ExecOptions configures Exec.
type ExecOptions struct {
	ImageDir    string
	WorkDir     string // scratch state for the run (removed after)
	TemplateDir string // templates (kept: a later run reuses them)
	Runs        int    // samples per latency figure (default 10)
	ColdRuns    int    // cold boots (default 2; each takes a full boot)
	Concurrency []int  // throughput levels (default 1, 2, 4)
	PoolSize    int    // pool size for the pooled figures (default 2)
	Accel       vm.Accel
	// TBSizeMiB is TCG's translation buffer per VM (0: QEMU's default).
	TBSizeMiB int
	// GuestASLR is the guests' address space randomisation
	// (vm.Runtime.GuestASLR; "": auto, as the daemon's default).
	GuestASLR string
	// Ahead is the daemons' clones launched ahead per shape (vm.Pool).
	Ahead int
	// SessionFileMiB is what the session of the pause and fork figures
	// writes (default 100); ForkIdle how many idle copies of one fork
	// point are measured (default 8).
	SessionFileMiB int
	ForkIdle       int
	// Only names the parts to measure (Parts; empty: all of them). A part
	// left out leaves its figures zero.
	Only []string
	Log  *slog.Logger
	// Progress receives one line per step (nil: none).
	Progress io.Writer
}

func (o *ExecOptions) defaults() {
	if o.Runs <= 0 {
		o.Runs = 10
	}
	if o.ColdRuns <= 0 {
		o.ColdRuns = 2
	}
	if o.SessionFileMiB <= 0 {
		o.SessionFileMiB = 100
	}
	if o.ForkIdle <= 0 {
		o.ForkIdle = 8
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{1, 2, 4}
	}
	if o.PoolSize <= 0 {
		o.PoolSize = 2
	}
	if o.Accel == "" {
		o.Accel = vm.AccelAuto
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

// Parts are the benchmark's parts, in the order they run: cold boots;
// restores from a template, with the idle memory and a kept VM's
// commands; the daemons' one-shots, throughput and receipts; and
// sessions that pause and fork; the E2B door; HTTPS with a secret.
var Parts = []string{"cold", "restore", "daemon", "sessions", "e2b", "secrets"}

// runs tells whether part is measured in this run.
func (o *ExecOptions) runs(part string) bool {
	return len(o.Only) == 0 || slices.Contains(o.Only, part)
}

// CheckParts returns an error naming the first of only that is no part.
func CheckParts(only []string) error {
	for _, p := range only {
		if !slices.Contains(Parts, p) {
			return fmt.Errorf("%q is not a part of the benchmark (%s)", p, strings.Join(Parts, ", "))
		}
	}
	return nil
}

// Exec runs the exec-path benchmark.
func Exec(ctx context.Context, o ExecOptions) (*ExecReport, error) {
	o.defaults()
	if err := os.MkdirAll(o.WorkDir, 0o700); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	work, err := os.MkdirTemp(o.WorkDir, "bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer os.RemoveAll(work)
	r := &execRun{o: o, work: work, rep: &ExecReport{When: time.Now().UTC(), ColdPhasesMS: map[string]Stat{}, Ratios: map[string]float64{}}}
	r.rep.Machine = machine()
	cgm, err := cgroup.OpenMode("auto", cgroup.GroupName(work), o.Log)
	if err != nil {
		return nil, err
	}
	if cgm != nil {
		defer cgm.Close()
		r.rep.Machine.Cgroups = cgm.String()
	} else {
		r.rep.Machine.Cgroups = "none (rlimits only)"
	}
	r.base = vm.Options{Runtime: vm.Runtime{StateDir: work, TemplateDir: o.TemplateDir, Accel: o.Accel, TCGTBSizeMiB: o.TBSizeMiB, GuestASLR: o.GuestASLR, Log: o.Log},
		ImageDir: o.ImageDir, Cgroups: cgm}
	r.rep.Levers = map[string]any{"overlay_from_cache": true, "tcg_tb_size_mib": o.TBSizeMiB, "ahead": o.Ahead, "guest_aslr": cmp.Or(o.GuestASLR, vm.GuestASLRAuto),
		"agent_protocol": agentproto.Protocol}
	if o.runs("cold") {
		if err := r.cold(ctx); err != nil {
			return nil, err
		}
	}
	if o.runs("restore") {
		if err := r.template(ctx); err != nil {
			return nil, err
		}
	}
	if o.runs("daemon") {
		if err := r.daemons(ctx); err != nil {
			return nil, err
		}
	}
	if o.runs("sessions") {
		if err := r.sessions(ctx); err != nil {
			return nil, fmt.Errorf("sessions: %w", err)
		}
	}
	if o.runs("e2b") {
		if err := r.e2b(ctx); err != nil {
			return nil, fmt.Errorf("e2b: %w", err)
		}
	}
	if o.runs("secrets") {
		if err := r.secrets(ctx); err != nil {
			return nil, fmt.Errorf("secrets: %w", err)
		}
	}
	r.ratios()
	return r.rep, nil
}

// execRun is one run of the exec benchmark: one phase per method, each
// filling its part of the report.
type execRun struct {
	o    ExecOptions
	work string
	base vm.Options
	rep  *ExecReport
}

func (r *execRun) step(format string, args ...any) {
	fmt.Fprintf(r.o.Progress, "bench: "+format+"\n", args...)
}

// ratios puts each fast path beside the cold path.
func (r *execRun) ratios() {
	rep := r.rep
	coldP50 := rep.ColdBootMS.P50
	ratio := func(name string, x float64) {
		if x > 0 {
			rep.Ratios[name] = math.Round(coldP50/x*10) / 10
		}
	}
	ratio("cold_over_restore", rep.RestoreMS.P50)
	ratio("cold_over_oneshot_pool", rep.OneshotPoolMS.P50)
	ratio("cold_over_oneshot_nopool", rep.OneshotNoPoolMS.P50)
	ratio("cold_over_oneshot_net_pool", rep.OneshotNetPoolMS.P50)
	if rep.Machine.Accel == string(vm.AccelTCG) {
		rep.Notes = append(rep.Notes, "TCG: a restored QEMU starts with an empty translation cache, so the guest's first code paths (the agent's first contact, the first commands) run several times slower than in a settled VM; the pool hides this by running one command in each VM before handing it out")
	}
}
