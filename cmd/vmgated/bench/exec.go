// Package bench measures vmgate. Exec measures the exec path: how long a
// fresh VM takes to become usable by each route (cold boot, restore from a
// template, the warm pool, through the daemon or not), how many one-shot
// commands a minute the daemon runs, and what an idle VM costs in memory.
// Every figure is measured in the same run, on the same image and host,
// beside the cold-boot baseline, and reported with the machine.
package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/inproc"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/procmem"
	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/policy"
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

// Stat summarises samples in milliseconds.
type Stat struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

func summarize(d []time.Duration) Stat {
	if len(d) == 0 {
		return Stat{}
	}
	ms := make([]float64, len(d))
	for i, x := range d {
		ms[i] = float64(x.Microseconds()) / 1000
	}
	slices.Sort(ms)
	return Stat{N: len(ms), P50: percentile(ms, 50), P95: percentile(ms, 95), Min: ms[0], Max: ms[len(ms)-1]}
}

// percentile of sorted values, nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Throughput is one concurrency level of one-shot commands.
type Throughput struct {
	Concurrency int     `json:"concurrency"`
	Commands    int     `json:"commands"`
	Seconds     float64 `json:"seconds"`
	PerMinute   float64 `json:"per_minute"`
	FromPool    int     `json:"from_pool"`
}

// Memory is the host memory of one idle VM's QEMU, from smaps_rollup.
type Memory struct {
	VMs    int     `json:"vms"`
	RSSMiB float64 `json:"rss_mib"`
	PSSMiB float64 `json:"pss_mib"`
}

// Machine describes the host the figures come from.
type Machine struct {
	CPUModel    string `json:"cpu_model"`
	CPUs        int    `json:"cpus"`
	MemTotalMiB int64  `json:"mem_total_mib"`
	Kernel      string `json:"kernel"`
	QEMU        string `json:"qemu"`
	Accel       string `json:"accel"`
	Cgroups     string `json:"cgroups"`
}

// ExecReport holds every figure of one run.
type ExecReport struct {
	Machine         Machine         `json:"machine"`
	When            time.Time       `json:"when"`
	ColdBootMS      Stat            `json:"cold_boot_ms"`
	TemplateMS      float64         `json:"template_ms"`
	TemplateBuilt   bool            `json:"template_built"`
	TemplateRAMMiB  float64         `json:"template_ram_data_mib"`
	RestoreMS       Stat            `json:"restore_ms"`
	RestorePhasesMS map[string]Stat `json:"restore_phases_ms"`
	RestoreFirstMS  Stat            `json:"restore_first_exec_ms"`
	// The same restore completed from a clone launched ahead
	// (vm.Template.Prestart): timed from Complete, QEMU already up.
	RestoreAheadMS       Stat            `json:"restore_ahead_ms"`
	RestoreAheadPhasesMS map[string]Stat `json:"restore_ahead_phases_ms"`
	RestoreAheadFirstMS  Stat            `json:"restore_ahead_first_exec_ms"`
	// IdleAhead is a clone launched ahead, waiting: its QEMU's memory.
	IdleAhead       Memory          `json:"idle_ahead_qemu"`
	ColdPhasesMS    map[string]Stat `json:"cold_phases_ms"`
	OneshotPoolMS   Stat            `json:"oneshot_pool_ms"`
	OneshotNoPoolMS Stat            `json:"oneshot_nopool_ms"`
	// The same through a profile with a network (an allowlist; the
	// command makes no connection): VMs with a NIC, from their own
	// template and pool, handed out once their network is ready.
	OneshotNetPoolMS   Stat `json:"oneshot_net_pool_ms"`
	OneshotNetNoPoolMS Stat `json:"oneshot_net_nopool_ms"`
	// RestoreHandshakeFailures counts restores in this run whose first
	// agent handshake failed (each replaced by a second clone); 0 is the
	// only right value.
	RestoreHandshakeFailures int64 `json:"restore_handshake_failures"`
	// The daemon's own account of each one-shot: getting the VM (boot_ms),
	// running the command (exec_ms) and its whole handling (total_ms).
	OneshotPoolPartsMS      map[string]Stat `json:"oneshot_pool_parts_ms"`
	OneshotNoPoolPartsMS    map[string]Stat `json:"oneshot_nopool_parts_ms"`
	OneshotNetPoolPartsMS   map[string]Stat `json:"oneshot_net_pool_parts_ms"`
	OneshotNetNoPoolPartsMS map[string]Stat `json:"oneshot_net_nopool_parts_ms"`
	SessionExecMS           Stat            `json:"session_exec_ms"`
	// Receipts, each figure a baseline without and the same with a
	// receipt (signed by the daemon, checked by the client), in pairs of
	// alternating order so that drift falls on both alike. Refused
	// requests (a policy denial: decision, audit record, answer; no VM)
	// isolate what a receipt adds: ReceiptOverheadMS is the median of
	// those pairs' differences (its budget: ReceiptBudgetMS). `true` in a
	// daemon's session shows it beside a command's whole round trip,
	// whose noise under TCG can exceed it (ReceiptOverheadSessionMS).
	RefusalNoReceiptMS       Stat         `json:"refusal_no_receipt_ms"`
	RefusalReceiptMS         Stat         `json:"refusal_receipt_ms"`
	ReceiptOverheadMS        float64      `json:"receipt_overhead_ms"`
	SessionNoReceiptMS       Stat         `json:"session_exec_no_receipt_ms"`
	SessionReceiptMS         Stat         `json:"session_exec_receipt_ms"`
	ReceiptOverheadSessionMS float64      `json:"receipt_overhead_session_ms"`
	Throughput               []Throughput `json:"throughput"`
	IdleRestored             Memory       `json:"idle_restored_vm"`
	// IdleRestoredN is the mean per VM with 1, 4 and 8 restored VMs idle.
	IdleRestoredN []Memory `json:"idle_restored_vms"`
	// Levers says which speed and memory levers this run used.
	Levers   map[string]any `json:"levers"`
	IdleCold Memory         `json:"idle_cold_vm"`
	// Sessions that last and branch (sessions.go): a session of the
	// default shape that wrote SessionFileMiB of files and runs a
	// background process.
	PauseMS       Stat               `json:"pause_ms"`
	ResumeMS      Stat               `json:"resume_ms"`
	ForkMS        Stat               `json:"fork_ms"`
	Fork4MS       Stat               `json:"fork4_ms"`
	ForkIdle      Memory             `json:"fork_idle"`
	ForkIdlePSS   float64            `json:"fork_idle_pss_mib"`
	PausedDiskMiB float64            `json:"paused_disk_mib"`
	Ratios        map[string]float64 `json:"ratios"`
	Notes         []string           `json:"notes,omitempty"`
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
// sessions that pause and fork.
var Parts = []string{"cold", "restore", "daemon", "sessions"}

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
	r.ratios()
	return r.rep, nil
}

// template measures the restores from a template (built or reused), the
// idle memory of restored VMs and a kept VM's commands.
func (r *execRun) template(ctx context.Context) error {
	r.step("template")
	t0 := time.Now()
	tmpl, err := vm.EnsureTemplate(ctx, r.base)
	if err != nil {
		return err
	}
	defer tmpl.Close()
	r.rep.TemplateMS = ms(time.Since(t0))
	r.rep.TemplateBuilt = tmpl.Built
	r.rep.Machine.Accel = string(tmpl.Meta.Accel)
	r.rep.TemplateRAMMiB = float64(tmpl.Meta.RAMDataBytes) / (1 << 20)
	for _, phase := range []func(context.Context, *vm.Template) error{r.restores, r.restoresAhead, r.idleAndSession} {
		if err := phase(ctx, tmpl); err != nil {
			return err
		}
	}
	r.rep.RestoreHandshakeFailures += tmpl.HandshakeFailures()
	return nil
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

// cold measures the cold path: new overlay, full boot, first command.
func (r *execRun) cold(ctx context.Context) error {
	var cold []time.Duration
	coldPhases := map[string][]time.Duration{}
	for i := 0; i < r.o.ColdRuns; i++ {
		r.step("cold boot %d/%d", i+1, r.o.ColdRuns)
		t0 := time.Now()
		v, err := vm.Start(ctx, r.base)
		if err != nil {
			return fmt.Errorf("cold boot: %w", err)
		}
		if err := execTrue(ctx, v); err != nil {
			v.Close()
			return fmt.Errorf("cold boot: %w", err)
		}
		cold = append(cold, time.Since(t0))
		r.rep.Machine.Accel = string(v.Accel)
		for _, p := range v.Phases() {
			coldPhases[p.Name] = append(coldPhases[p.Name], p.Dur)
		}
		if i == r.o.ColdRuns-1 {
			r.rep.IdleCold = idleMemory(ctx, []int{v.Pid()})
		}
		if err := v.Close(); err != nil {
			return err
		}
	}
	r.rep.ColdBootMS = summarize(cold)
	for k, d := range coldPhases {
		r.rep.ColdPhasesMS[k] = summarize(d)
	}
	return nil
}

// restores measures restores (request to agent ready) and the first
// command after each.
func (r *execRun) restores(ctx context.Context, tmpl *vm.Template) error {
	var err error
	r.rep.RestoreMS, r.rep.RestoreFirstMS, r.rep.RestorePhasesMS, err = r.sampleRestores(ctx, "restore", func(int) (*vm.VM, error) {
		return tmpl.Restore(ctx)
	})
	return err
}

// restoresAhead measures restores completed from clones launched ahead
// (each waits a moment first, as one in a pool does), the first command
// after each, and a waiting clone's memory.
func (r *execRun) restoresAhead(ctx context.Context, tmpl *vm.Template) error {
	var err error
	r.rep.RestoreAheadMS, r.rep.RestoreAheadFirstMS, r.rep.RestoreAheadPhasesMS, err = r.sampleRestores(ctx, "restore launched ahead", func(i int) (*vm.VM, error) {
		a, err := tmpl.Prestart(ctx)
		if err != nil {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond) // QEMU settles, as it would while it waits in a pool
		if i == 0 {
			r.rep.IdleAhead = idleMemory(ctx, []int{a.Pid()})
		}
		return a.Complete(ctx)
	})
	return err
}

// sampleRestores makes Runs VMs with restore, timing each (its own
// account: BootDuration and phases) and the first command in it.
func (r *execRun) sampleRestores(ctx context.Context, what string, restore func(i int) (*vm.VM, error)) (all, first Stat, phases map[string]Stat, err error) {
	var restores, firsts []time.Duration
	byPhase := map[string][]time.Duration{}
	for i := 0; i < r.o.Runs; i++ {
		r.step("%s %d/%d", what, i+1, r.o.Runs)
		v, err := restore(i)
		if err != nil {
			return all, first, nil, err
		}
		restores = append(restores, v.BootDuration())
		for _, p := range v.Phases() {
			byPhase[p.Name] = append(byPhase[p.Name], p.Dur)
		}
		t1 := time.Now()
		err = execTrue(ctx, v)
		firsts = append(firsts, time.Since(t1))
		v.Close()
		if err != nil {
			return all, first, nil, err
		}
	}
	phases = map[string]Stat{}
	for k, d := range byPhase {
		phases[k] = summarize(d)
	}
	return summarize(restores), summarize(firsts), phases, nil
}

// idleAndSession measures the memory of idle restored VMs and commands in
// a kept VM.
func (r *execRun) idleAndSession(ctx context.Context, tmpl *vm.Template) error {
	r.step("idle memory and session exec")
	var idle []*vm.VM
	defer func() {
		for _, v := range idle {
			v.Close()
		}
	}()
	for _, n := range []int{1, 2, 4, 8} {
		for len(idle) < n {
			v, err := tmpl.Restore(ctx)
			if err != nil {
				return err
			}
			idle = append(idle, v)
			if err := execTrue(ctx, v); err != nil {
				return err
			}
		}
		m := idleMemory(ctx, pids(idle))
		if n == 2 {
			r.rep.IdleRestored = m
		} else {
			r.rep.IdleRestoredN = append(r.rep.IdleRestoredN, m)
		}
	}
	var sess []time.Duration
	for i := 0; i < r.o.Runs; i++ {
		t1 := time.Now()
		if err := execTrue(ctx, idle[0]); err != nil {
			return err
		}
		sess = append(sess, time.Since(t1))
	}
	r.rep.SessionExecMS = summarize(sess)
	return nil
}

// daemons measures through the daemon: one-shots with a pool (and
// throughput), without one, and the same through a profile with a network.
func (r *execRun) daemons(ctx context.Context) error {
	o, rep := r.o, r.rep
	throughputs := func(c *client.Client, waitPool func() error) error {
		for _, conc := range o.Concurrency {
			if err := waitPool(); err != nil {
				return err
			}
			r.step("throughput at concurrency %d", conc)
			tp, err := throughput(ctx, c, conc, max(o.Runs, 2*conc))
			if err != nil {
				return err
			}
			rep.Throughput = append(rep.Throughput, tp)
		}
		return nil
	}
	for _, d := range []struct {
		name    string
		network bool
		pool    int
		stat    *Stat
		parts   *map[string]Stat
		then    func(*client.Client, func() error) error
	}{
		{"pool", false, o.PoolSize, &rep.OneshotPoolMS, &rep.OneshotPoolPartsMS, func(c *client.Client, waitPool func() error) error {
			if err := throughputs(c, waitPool); err != nil {
				return err
			}
			r.step("receipt overhead")
			return receiptOverhead(ctx, c, max(o.Runs, 30), rep)
		}},
		{"nopool", false, 0, &rep.OneshotNoPoolMS, &rep.OneshotNoPoolPartsMS, nil},
		{"netpool", true, o.PoolSize, &rep.OneshotNetPoolMS, &rep.OneshotNetPoolPartsMS, nil},
		{"netnopool", true, 0, &rep.OneshotNetNoPoolMS, &rep.OneshotNetNoPoolPartsMS, nil},
	} {
		r.step("daemon %s (network %v, pool of %d)", d.name, d.network, d.pool)
		var err error
		if *d.stat, *d.parts, err = daemonOneshots(ctx, o, r.work, d.name, d.network, d.pool, rep, d.then); err != nil {
			return err
		}
	}
	return nil
}

// ReceiptBudgetMS is what a receipt may add to a command (issue 32).
const ReceiptBudgetMS = 2

// receiptOverhead measures what a receipt adds to a request, pairs of
// requests without and with one in alternating order: refused ones (a
// timeout over the policy's maximum), then `true` in a session; and
// fills in rep's receipt figures.
func receiptOverhead(ctx context.Context, c *client.Client, pairs int, rep *ExecReport) error {
	const session = "bench-receipts"
	defer func() {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = c.EndSession(ectx, session)
	}()
	refused := wire.ExecRequest{Argv: []string{"true"}, TimeoutMS: (24 * time.Hour).Milliseconds()}
	refusal := func(receipt bool) (time.Duration, error) {
		req := refused
		req.Receipt = receipt
		t0 := time.Now()
		_, err := c.Exec(ctx, req, client.ExecIO{})
		d := time.Since(t0)
		switch {
		case !errors.Is(err, client.ErrDenied):
			return 0, fmt.Errorf("receipt overhead: a timeout over the maximum was not refused: %v", err)
		case receipt && len(client.ReceiptOf(err)) == 0:
			return 0, errors.New("receipt overhead: the refusal carried no receipt")
		}
		return d, nil
	}
	inSession := func(receipt bool) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		t0 := time.Now()
		res, err := c.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}, Session: session, Receipt: receipt}, client.ExecIO{})
		d := time.Since(t0)
		switch {
		case err != nil:
			return 0, fmt.Errorf("receipt overhead: %w", err)
		case receipt && len(res.Receipt) == 0:
			return 0, errors.New("receipt overhead: no receipt came")
		}
		return d, nil
	}
	if _, err := inSession(false); err != nil { // the session's VM, and a first command
		return err
	}
	var err error
	if rep.RefusalNoReceiptMS, rep.RefusalReceiptMS, rep.ReceiptOverheadMS, err = measurePairs(pairs, refusal); err != nil {
		return err
	}
	if rep.SessionNoReceiptMS, rep.SessionReceiptMS, rep.ReceiptOverheadSessionMS, err = measurePairs(pairs, inSession); err != nil {
		return err
	}
	if rep.ReceiptOverheadMS >= ReceiptBudgetMS {
		rep.Notes = append(rep.Notes, fmt.Sprintf("a receipt costs %.2f ms per request, over its %d ms budget", rep.ReceiptOverheadMS, ReceiptBudgetMS))
	}
	return nil
}

// measurePairs runs pairs of run(false), run(true), the order alternating
// from pair to pair, and returns both distributions and the median of
// the pairs' differences.
func measurePairs(pairs int, run func(receipt bool) (time.Duration, error)) (without, with Stat, overhead float64, err error) {
	var a, b []time.Duration
	for i := range pairs {
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, receipt := range order {
			d, err := run(receipt)
			if err != nil {
				return Stat{}, Stat{}, 0, err
			}
			if receipt {
				b = append(b, d)
			} else {
				a = append(a, d)
			}
		}
	}
	return summarize(a), summarize(b), pairedMedian(a, b), nil
}

// pairedMedian is the median, in milliseconds, of b[i]-a[i].
func pairedMedian(a, b []time.Duration) float64 {
	n := min(len(a), len(b))
	if n == 0 {
		return 0
	}
	d := make([]float64, n)
	for i := range n {
		d[i] = float64((b[i] - a[i]).Microseconds()) / 1000
	}
	slices.Sort(d)
	if n%2 == 1 {
		return d[n/2]
	}
	return math.Round((d[n/2-1]+d[n/2])/2*1000) / 1000
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

// daemonOneshots starts a daemon with a pool of pool VMs (0: each request
// restores its VM) and times one-shot commands through it, which must get
// VMs from the pool or restored; then runs then, if set.
func daemonOneshots(ctx context.Context, o ExecOptions, work, name string, network bool, pool int, rep *ExecReport, then func(*client.Client, func() error) error) (Stat, map[string]Stat, error) {
	var st Stat
	var parts map[string]Stat
	err := withDaemon(ctx, o, work, name, pool, network, rep, func(c *client.Client, waitPool func() error) error {
		want, before := "pool", waitPool
		if pool == 0 {
			// The template is loaded (or built) when the pool of zero
			// is listed; then every request restores.
			if err := waitPool(); err != nil {
				return err
			}
			want, before = "restore", nil
		}
		var err error
		if st, parts, err = sampleOneshots(ctx, c, o.Runs, want, before); err != nil {
			return err
		}
		if then != nil {
			return then(c, waitPool)
		}
		return nil
	})
	return st, parts, err
}

// sampleOneshots times runs one-shot commands, each after before (if
// set), and requires each VM to have been made the way want says.
func sampleOneshots(ctx context.Context, c *client.Client, runs int, want string, before func() error) (Stat, map[string]Stat, error) {
	var d []time.Duration
	parts := newParts()
	for i := 0; i < runs; i++ {
		if before != nil {
			if err := before(); err != nil {
				return Stat{}, nil, err
			}
		}
		t1 := time.Now()
		res, err := oneshot(ctx, c)
		if err != nil {
			return Stat{}, nil, err
		}
		if res.VMStart != want {
			return Stat{}, nil, fmt.Errorf("one-shot got a VM by %q, want %q", res.VMStart, want)
		}
		d = append(d, time.Since(t1))
		parts.add(res)
	}
	return summarize(d), parts.stats(), nil
}

// parts collects the daemon's timings of one-shot results.
type parts map[string][]time.Duration

func newParts() parts { return parts{} }

func (p parts) add(r *wire.Result) {
	p["vm"] = append(p["vm"], time.Duration(r.BootMS)*time.Millisecond)
	p["exec"] = append(p["exec"], time.Duration(r.ExecMS)*time.Millisecond)
	p["daemon_total"] = append(p["daemon_total"], time.Duration(r.TotalMS)*time.Millisecond)
}

func (p parts) stats() map[string]Stat {
	out := map[string]Stat{}
	for k, d := range p {
		out[k] = summarize(d)
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func execTrue(ctx context.Context, v *vm.VM) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	res, err := v.Exec(ctx, vm.ExecRequest{Argv: []string{"true"}})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", res.ExitCode)
	}
	return err
}

func oneshot(ctx context.Context, c *client.Client) (*wire.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	res, err := c.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}}, client.ExecIO{})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", res.ExitCode)
	}
	return res, err
}

// throughput runs n one-shot commands on conc workers.
func throughput(ctx context.Context, c *client.Client, conc, n int) (Throughput, error) {
	jobs := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	var (
		mu       sync.Mutex
		firstErr error
		pooled   int
	)
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < conc; w++ {
		wg.Go(func() {
			for range jobs {
				res, err := oneshot(ctx, c)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && res.VMStart == "pool" {
					pooled++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	secs := time.Since(t0).Seconds()
	if firstErr != nil {
		return Throughput{}, fmt.Errorf("throughput at %d: %w", conc, firstErr)
	}
	return Throughput{Concurrency: conc, Commands: n, Seconds: math.Round(secs*100) / 100, PerMinute: math.Round(float64(n)/secs*60*10) / 10, FromPool: pooled}, nil
}

// withDaemon runs the real gateway in-process on its own socket with the
// given pool size, on the built-in policy or (network) the built-in
// policy with a network allowlist, and calls fn with a client and a
// function that waits until the pool of that shape is full. The daemon's
// handshake failures are added to rep.
func withDaemon(ctx context.Context, o ExecOptions, work, name string, pool int, network bool, rep *ExecReport, fn func(*client.Client, func() error) error) error {
	d, err := inproc.Start(ctx, inproc.Options{Dir: filepath.Join(work, name), ImageDir: o.ImageDir, TemplateDir: o.TemplateDir,
		Policy: withASLR(benchPolicy(maxVMs(o), network), o.GuestASLR), MaxVMs: maxVMs(o), PoolSize: pool, Ahead: o.Ahead, Accel: o.Accel, TBSizeMiB: o.TBSizeMiB, Log: o.Log})
	if err != nil {
		return err
	}
	err = fn(d.Client, func() error { return d.WaitPoolOf(ctx, pool, network) })
	n, serr := d.HandshakeFailures(ctx)
	rep.RestoreHandshakeFailures += n
	return errors.Join(err, serr, d.Stop())
}

// withASLR sets the policy's isolate.guest_aslr to aslr ("": its default).
func withASLR(text []byte, aslr string) []byte {
	if aslr == "" {
		return text
	}
	return append(text, fmt.Sprintf("\n[isolate]\nguest_aslr = %q\n", aslr)...)
}

// benchPolicy is the built-in policy with room for maxVMs VMs, all for
// the one caller, the benchmark, and with network a network allowlist of
// one name: the benchmark's commands make no connection, so nothing is
// looked up. The built-in policy's own values are replaced whatever they
// are (TestBenchPolicy checks the result).
func benchPolicy(maxVMs int, network bool) []byte {
	text := policy.DefaultTOML()
	for _, key := range []string{"max_vms", "max_vms_per_caller"} {
		re := regexp.MustCompile(`(?m)^` + key + ` = \d+$`)
		text = re.ReplaceAll(text, []byte(fmt.Sprintf("%s = %d", key, maxVMs)))
	}
	if network {
		text = bytes.Replace(text, []byte("\nmode = \"none\"\n"), []byte("\nmode = \"allowlist\"\nallow = [\"bench.invalid:443\"]\n"), 1)
	}
	return text
}

// maxVMs is the daemon's and the bench policy's VM limit: the highest
// concurrency measured.
func maxVMs(o ExecOptions) int { return max(slices.Max(o.Concurrency), 1) }

// idleMemory lets the VMs settle and reads their QEMUs' RSS and PSS.
func idleMemory(ctx context.Context, qemus []int) Memory {
	select {
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
	}
	var rss, pss float64
	for _, pid := range qemus {
		r, p := smapsRollup(pid)
		rss += r
		pss += p
	}
	n := float64(len(qemus))
	return Memory{VMs: len(qemus), RSSMiB: math.Round(rss/n*10) / 10, PSSMiB: math.Round(pss/n*10) / 10}
}

// pids are the QEMU processes of vms.
func pids(vms []*vm.VM) []int {
	out := make([]int, len(vms))
	for i, v := range vms {
		out[i] = v.Pid()
	}
	return out
}

// smapsRollup returns Rss and Pss of pid in MiB (zeros when unreadable).
func smapsRollup(pid int) (rss, pss float64) {
	rss, pss, _ = procmem.Rollup(pid)
	return rss, pss
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
				m.MemTotalMiB = kb >> 10
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if v, err := vm.QEMUVersion("qemu-system-x86_64"); err == nil {
		m.QEMU = v
	}
	return m
}
