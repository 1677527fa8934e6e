package agentbench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/inproc"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/procmem"
	"github.com/vmgate/vmgate/vm"
)

// Failure modes of an unresolved trial.
const (
	FailHarness = "harness_error"   // inject or verification could not run: the trial says nothing about the agent
	FailAgent   = "agent_error"     // the endpoint failed
	FailGuard   = "guard_broken"    // something that had to keep working was broken
	FailTimeout = "timeout"         // the agent ran out of time with the fault still there
	FailTurns   = "turns_exhausted" // the agent ran out of turns with the fault still there
	FailNotFix  = "not_fixed"       // the agent stopped (or declared done) with the fault still there
)

// Options configure a benchmark run.
type Options struct {
	Scenarios []*Scenario
	// NewAgent returns the agent for one trial (run counts from 1) with
	// that trial's sampling: Sampling, its seed (if any) + run - 1.
	NewAgent                   func(run int, s Sampling) Agent
	AgentName, Model, Endpoint string
	Sampling                   Sampling
	Stream                     bool
	Runs, Parallel             int
	Seed                       int64
	Out                        string // results.jsonl, traces/, summary.json, summary.md
	// Socket, when set, is a running vmgated to use (its policy must give
	// the caller root in the guest, shell strings and sessions); otherwise
	// the run starts its own in-process daemon on the bench policy.
	Socket                          string
	ImageDir, StateDir, TemplateDir string
	Accel                           vm.Accel
	MemoryMiB                       int
	// Fork injects each scenario's fault once, into a session that is
	// then forked into Runs copies (pass@k from one broken state), one
	// trial per copy, instead of injecting it once per trial.
	Fork     bool
	Log      *slog.Logger
	Progress io.Writer // one line per finished trial (nil: none)
}

// CheckResult is one check of a trial's verification.
type CheckResult struct {
	Phase  string `json:"phase"` // check, guard, protect
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// TrialResult is one line of results.jsonl.
type TrialResult struct {
	Scenario   string    `json:"scenario"`
	Title      string    `json:"title"`
	Category   string    `json:"category"`
	Difficulty string    `json:"difficulty"`
	Run        int       `json:"run"`
	Agent      string    `json:"agent"`
	Model      string    `json:"model,omitempty"`
	Endpoint   string    `json:"endpoint,omitempty"`
	Sampling   Sampling  `json:"sampling"`
	Stream     bool      `json:"stream,omitempty"`
	Started    time.Time `json:"started"`

	Resolved     bool          `json:"resolved"`
	CheckPassed  bool          `json:"check_passed"`
	GuardsPassed bool          `json:"guards_passed"`
	Checks       []CheckResult `json:"checks"`
	FailureMode  string        `json:"failure_mode,omitempty"`
	AgentResult
	AgentSeconds float64  `json:"agent_seconds"`
	WallSeconds  float64  `json:"wall_seconds"`
	TimeToFix    *float64 `json:"time_to_fix_seconds"`
	Trace        string   `json:"trace"`
	VMStart      string   `json:"vm_start,omitempty"`
	// ForkedFrom names the session whose injected state this trial's
	// session is a copy of (--fork).
	ForkedFrom string `json:"forked_from,omitempty"`
	Error      string `json:"error,omitempty"`
	// Receipts is the directory (relative to the run's output) of the
	// signed receipts of the trial's commands, ReceiptCount how many it
	// holds; ReceiptErrors are receipts the client refused or could not
	// write (receipts.go).
	Receipts      string   `json:"receipts,omitempty"`
	ReceiptCount  int      `json:"receipt_count"`
	ReceiptErrors []string `json:"receipt_errors,omitempty"`
}

// Run runs every scenario Runs times with P trials at once and writes
// the results; it returns the summary. A trial's failure is a result, not
// an error; errors are for runs that could not take place.
func Run(ctx context.Context, o Options) (*Summary, error) {
	if o.Runs < 1 || o.Parallel < 1 {
		return nil, errors.New("runs and parallel must be at least 1")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	resf, err := o.createResults()
	if err != nil {
		return nil, err
	}
	defer resf.Close()

	c, stop, err := o.daemon(ctx)
	if err != nil {
		return nil, err
	}
	defer stop()
	if err := saveReceiptKey(ctx, c, o.Out); err != nil {
		return nil, err
	}
	forks := newForks(o.Scenarios)
	started := time.Now()
	results, err := o.runTrials(ctx, c, forks, o.jobs(), json.NewEncoder(resf))
	if err != nil {
		return nil, err
	}
	s := Summarize(results)
	s.Started, s.Seconds = started, math.Round(time.Since(started).Seconds()*10)/10
	s.Forks = forks.summaries(o.Scenarios)
	if err := WriteSummary(o.Out, s); err != nil {
		return nil, err
	}
	return s, nil
}

// createResults makes the output directory (with traces/) and creates
// its results.jsonl, which must not exist yet.
func (o *Options) createResults() (*os.File, error) {
	if err := os.MkdirAll(filepath.Join(o.Out, "traces"), 0o755); err != nil {
		return nil, err
	}
	resf, err := os.OpenFile(filepath.Join(o.Out, "results.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("results: %w (use a new --out directory)", err)
	}
	return resf, nil
}

// job is one trial to run: run number run of scenario sc.
type job struct {
	sc  *Scenario
	run int
}

// jobs are the run's trials, every scenario's Runs of them, shuffled by
// Seed. With --fork, a scenario's runs go one after the other, so that
// its copies (made when its first run starts) live only as long as its
// trials.
func (o *Options) jobs() []job {
	var jobs []job
	for _, sc := range o.Scenarios {
		for run := 1; run <= o.Runs; run++ {
			jobs = append(jobs, job{sc, run})
		}
	}
	rng := mrand.New(mrand.NewPCG(uint64(o.Seed), 0x766d67617465))
	if !o.Fork {
		rng.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
	}
	return jobs
}

// runTrials runs jobs on Parallel workers and returns their results in
// the order they finished, each also written to enc (results.jsonl) as
// it comes. An interrupted run (ctx done) returns ctx's error: a trial
// cut short says nothing and is not recorded.
func (o *Options) runTrials(ctx context.Context, c *client.Client, forks *forks, jobs []job, enc *json.Encoder) ([]TrialResult, error) {
	q := &trialQueue{progress: o.Progress, enc: enc, jobs: jobs}
	var wg sync.WaitGroup
	for range min(o.Parallel, len(jobs)) {
		wg.Go(func() {
			for {
				j, ok := q.take(ctx)
				if !ok {
					return
				}
				r := o.runJob(ctx, c, forks, j)
				if ctx.Err() != nil {
					return // interrupted: the trial says nothing
				}
				q.record(r)
			}
		})
	}
	wg.Wait()
	if q.werr != nil {
		return nil, q.werr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return q.results, nil
}

// runJob runs j's trial; with --fork in a copy of its scenario's
// injected state, whose failure is the trial's harness error.
func (o *Options) runJob(ctx context.Context, c *client.Client, forks *forks, j job) TrialResult {
	f, err := forks.get(ctx, o, c, j.sc)
	if err != nil {
		return TrialResult{Scenario: j.sc.ID, Title: j.sc.Title, Category: j.sc.Category, Difficulty: j.sc.Difficulty, Run: j.run,
			Agent: o.AgentName, Model: o.Model, FailureMode: FailHarness, Error: err.Error()}
	}
	return o.trial(ctx, c, j.sc, j.run, f)
}

// trialQueue hands the jobs to the workers one at a time and records
// their results, with a progress line for each.
type trialQueue struct {
	progress io.Writer // nil: no progress lines
	enc      *json.Encoder

	mu      sync.Mutex
	jobs    []job
	next    int // the next job to hand out
	results []TrialResult
	werr    error // the first failed write to enc
}

// take returns the next job, or false when none is left or ctx is done.
func (q *trialQueue) take(ctx context.Context) (job, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.next >= len(q.jobs) || ctx.Err() != nil {
		return job{}, false
	}
	j := q.jobs[q.next]
	q.next++
	if q.progress != nil {
		fmt.Fprintf(q.progress, "        %s run %d: started (%d running, %d waiting)\n", j.sc.ID, j.run,
			q.next-len(q.results), len(q.jobs)-q.next)
	}
	return j, true
}

// record keeps r and writes it to results.jsonl.
func (q *trialQueue) record(r TrialResult) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.results = append(q.results, r)
	if err := q.enc.Encode(r); err != nil && q.werr == nil {
		q.werr = fmt.Errorf("results: %w", err)
	}
	if q.progress != nil {
		fmt.Fprintf(q.progress, "[%d/%d] %s\n", len(q.results), len(q.jobs), progressLine(r))
	}
}

func progressLine(r TrialResult) string {
	verdict := "resolved"
	if !r.Resolved {
		verdict = "NOT resolved (" + r.FailureMode + ")"
	}
	s := fmt.Sprintf("%s run %d, %s: %s; %d turns, %d tool calls, %.1f s", r.Scenario, r.Run, r.Agent, verdict, r.Turns, r.ToolCalls, r.WallSeconds)
	if r.Error != "" {
		s += ": " + r.Error
	}
	return s
}

// BenchPolicy is the policy of the run's own daemon: root in the guest
// (the agent is the server's administrator), shell strings, sessions.
func BenchPolicy(maxVMs, memoryMiB int) []byte {
	return fmt.Appendf(nil, `version = 1

[[profile]]
name = "bench"
match = { any = true }
image = "default"
user = "root"
memory_mib = %d
cpus = 1
max_vms = %d
max_vms_per_caller = %[2]d
output_limit = "1MiB"
allow_shell = true
env = []
timeout = { default = "30s", max = "30m" }
sessions = { allowed = true, idle_timeout = "30m", max_lifetime = "4h" }
network = { mode = "none" }
`, memoryMiB, maxVMs)
}

func (o *Options) daemon(ctx context.Context) (*client.Client, func(), error) {
	if o.Socket != "" {
		c := client.New(o.Socket)
		if _, err := c.Status(ctx); err != nil {
			return nil, nil, err
		}
		return c, func() {}, nil
	}
	mem := o.MemoryMiB
	if mem == 0 {
		mem = 512
	}
	dir, err := os.MkdirTemp(o.StateDir, "ba-") // short: VM socket paths are limited
	if err != nil {
		return nil, nil, err
	}
	vms := o.Parallel
	if o.Fork {
		vms += o.Runs + 1 // a scenario's copies and its base live at once
	}
	d, err := inproc.Start(ctx, inproc.Options{Dir: dir, ImageDir: o.ImageDir, TemplateDir: o.TemplateDir,
		Policy: BenchPolicy(vms, mem), MaxVMs: vms, PoolSize: min(o.Parallel, 2), Accel: o.Accel, Log: o.Log})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	// Keep the daemon's audit log with the results: every command of
	// every trial is in it.
	return d.Client, func() {
		if err := d.Stop(); err != nil {
			o.Log.Warn("bench daemon stopped with an error", "err", err)
		}
		if b, err := os.ReadFile(d.AuditPath); err == nil {
			_ = os.WriteFile(filepath.Join(o.Out, "audit.jsonl"), b, 0o644)
		}
		os.RemoveAll(dir)
	}, nil
}

// tracer appends events to a trial's trace file.
type tracer struct {
	mu  sync.Mutex
	enc *json.Encoder
	t0  time.Time
}

func (t *tracer) event(kind string, fields map[string]any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev := map[string]any{"t": math.Round(time.Since(t.t0).Seconds()*1000) / 1000, "event": kind}
	for k, v := range fields {
		ev[k] = v
	}
	_ = t.enc.Encode(ev)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// trial runs one scenario once: inject, agent, settle, verify, in one
// session VM that is ended afterwards whatever happened.
func (o *Options) trial(ctx context.Context, c *client.Client, sc *Scenario, run int, fork *forkSet) (r TrialResult) {
	t0 := time.Now()
	r = TrialResult{Scenario: sc.ID, Title: sc.Title, Category: sc.Category, Difficulty: sc.Difficulty, Run: run,
		Agent: o.AgentName, Model: o.Model, Endpoint: o.Endpoint, Sampling: o.Sampling, Stream: o.Stream, Started: t0.UTC(),
		Trace: filepath.Join("traces", fmt.Sprintf("%s-run%d.jsonl", sc.ID, run))}
	if r.Sampling.Seed != nil {
		s := *r.Sampling.Seed + int64(run) - 1
		r.Sampling.Seed = &s
	}
	defer func() { r.WallSeconds = math.Round(time.Since(t0).Seconds()*10) / 10 }()
	tf, err := os.Create(filepath.Join(o.Out, r.Trace))
	if err != nil {
		r.FailureMode, r.Error = FailHarness, err.Error()
		return r
	}
	defer tf.Close()
	bw := bufio.NewWriter(tf)
	defer bw.Flush()
	tr := &tracer{enc: json.NewEncoder(bw), t0: t0}
	tr.enc.SetEscapeHTML(false)
	tr.event("trial", map[string]any{"scenario": sc.ID, "run": run, "agent": o.AgentName, "model": o.Model,
		"instruction": sc.Instruction, "max_turns": sc.MaxTurns, "agent_time_limit_s": sc.AgentLimit.Seconds()})

	session := fmt.Sprintf("bench-%.32s-%d-%s", sc.ID, run, randHex(4))
	if fork != nil {
		session, r.ForkedFrom = fork.copies[run-1], fork.base
	}
	defer func() {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := c.EndSession(ectx, session); err != nil && ctx.Err() == nil {
			o.Log.Warn("ending the trial's session", "session", session, "err", err)
		}
	}()
	keep := newReceiptKeeper(o.Out, &r)
	script := sessionScript(c, session, keep)

	var before map[string]string
	if fork != nil {
		// Broken once, copied: the fault and the protected files are the
		// fork point's.
		tr.event("inject", map[string]any{"forked_from": fork.base, "exit_code": 0})
		r.VMStart, before = "fork", fork.before
	} else {
		var err error
		if before, err = o.inject(ctx, sc, script, tr, &r); err != nil {
			r.FailureMode, r.Error = FailHarness, err.Error()
			return r
		}
	}
	o.runAgent(ctx, c, sc, run, session, script, keep, tr, &r)
	if ctx.Err() != nil {
		r.Stop, r.FailureMode, r.Error = StopCanceled, FailHarness, "run interrupted"
		return r
	}
	// Settle, then verify.
	select {
	case <-ctx.Done():
	case <-time.After(sc.Settle):
	}
	r.judge(o.verify(ctx, sc, script, before, tr, &r))
	tr.event("verdict", map[string]any{"resolved": r.Resolved, "failure_mode": r.FailureMode, "checks": r.Checks})
	return r
}

// inject breaks the trial's VM and returns the protected files' hashes.
func (o *Options) inject(ctx context.Context, sc *Scenario, script scriptFunc, tr *tracer, r *TrialResult) (map[string]string, error) {
	out, code, res, err := script(ctx, sc.Inject, 5*time.Minute)
	tr.event("inject", map[string]any{"exit_code": code, "output": out, "error": errString(err)})
	if res != nil && r != nil {
		r.VMStart = res.VMStart
	}
	if err != nil || code != 0 {
		return nil, fmt.Errorf("inject.sh: exit %d %v: %s", code, errString(err), tail(out, 400))
	}
	before, err := o.hashes(ctx, script, sc.Protect, sc.VerifyLimit)
	if err != nil {
		return nil, fmt.Errorf("protected files: %w", err)
	}
	return before, nil
}

// forkSet is a scenario's fault injected once and forked into one session
// per run.
type forkSet struct {
	ForkSummary
	base   string
	copies []string
	before map[string]string
}

// ForkSummary is what --fork cost for a scenario, beside injecting the
// fault once per run: the one injection, the fork into Copies sessions,
// and the memory of the copies (their QEMUs' mean PSS) when it can be
// read.
type ForkSummary struct {
	Scenario       string  `json:"scenario"`
	Copies         int     `json:"copies"`
	InjectSeconds  float64 `json:"inject_seconds"`
	ForkSeconds    float64 `json:"fork_seconds"`
	InjectKSeconds float64 `json:"inject_k_times_seconds"` // Copies × the one injection: what --fork saves
	CopyPSSMiB     float64 `json:"copy_pss_mib,omitempty"`
	CopyRSSMiB     float64 `json:"copy_rss_mib,omitempty"`
}

// forks makes each scenario's fork set once, when its first run starts
// (only with Options.Fork).
type forks struct {
	sets map[string]*lazyFork // made up front, read only after
}

type lazyFork struct {
	once sync.Once
	set  *forkSet
	err  error
}

func newForks(scs []*Scenario) *forks {
	f := &forks{sets: map[string]*lazyFork{}}
	for _, sc := range scs {
		f.sets[sc.ID] = &lazyFork{}
	}
	return f
}

// get returns the scenario's fork set (nil without Options.Fork).
func (f *forks) get(ctx context.Context, o *Options, c *client.Client, sc *Scenario) (*forkSet, error) {
	if !o.Fork {
		return nil, nil
	}
	l := f.sets[sc.ID]
	l.once.Do(func() { l.set, l.err = o.prepareFork(ctx, c, sc) })
	return l.set, l.err
}

// summaries lists the fork sets made, in scenario order.
func (f *forks) summaries(scs []*Scenario) []ForkSummary {
	var out []ForkSummary
	for _, sc := range scs {
		if l := f.sets[sc.ID]; l != nil && l.set != nil {
			out = append(out, l.set.ForkSummary)
		}
	}
	return out
}

// prepareFork injects the scenario's fault once and forks it into Runs
// sessions, one per trial.
func (o *Options) prepareFork(ctx context.Context, c *client.Client, sc *Scenario) (*forkSet, error) {
	f := &forkSet{ForkSummary: ForkSummary{Scenario: sc.ID, Copies: o.Runs}, base: fmt.Sprintf("bench-%.32s-base-%s", sc.ID, randHex(4))}
	tf, err := os.Create(filepath.Join(o.Out, "traces", sc.ID+"-inject.jsonl"))
	if err != nil {
		return nil, err
	}
	tr := &tracer{enc: json.NewEncoder(tf), t0: time.Now()}
	t0 := time.Now()
	// The fork point's receipts: its injection is every copy's.
	keep := &receiptKeeper{dir: filepath.Join(o.Out, "receipts", sc.ID+"-inject"), r: &TrialResult{}}
	f.before, err = o.inject(ctx, sc, sessionScript(c, f.base, keep), tr, nil)
	tf.Close()
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", sc.ID, err)
	}
	f.InjectSeconds = math.Round(time.Since(t0).Seconds()*10) / 10
	f.InjectKSeconds = math.Round(f.InjectSeconds*float64(o.Runs)*10) / 10
	for run := 1; run <= o.Runs; run++ {
		f.copies = append(f.copies, fmt.Sprintf("bench-%.32s-%d-%s", sc.ID, run, randHex(4)))
	}
	t1 := time.Now()
	copies, err := c.ForkSession(ctx, f.base, f.copies)
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", sc.ID, err)
	}
	f.ForkSeconds = math.Round(time.Since(t1).Seconds()*100) / 100
	f.CopyRSSMiB, f.CopyPSSMiB = copiesMemory(copies)
	// The copies hold the fork point; the base's VM is not needed.
	if err := c.EndSession(ctx, f.base); err != nil {
		o.Log.Warn("ending a fork's base session", "session", f.base, "err", err)
	}
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, "        %s: injected once in %.1f s, forked into %d in %.2f s\n", sc.ID, f.InjectSeconds, o.Runs, f.ForkSeconds)
	}
	return f, nil
}

// sessionScript runs a script (bash -s, the text on stdin) in the trial's
// session: its output (capped), exit code and result; keep keeps its
// receipt.
func sessionScript(c *client.Client, session string, keep *receiptKeeper) scriptFunc {
	return func(ctx context.Context, text []byte, limit time.Duration) (string, int, *wire.Result, error) {
		out := &shelltool.Capped{Limit: 64 << 10}
		res, err := c.Exec(ctx, wire.ExecRequest{Argv: []string{"bash", "-s"}, Session: session, TimeoutMS: max(limit.Milliseconds(), 1000), Receipt: true},
			client.ExecIO{Stdin: bytes.NewReader(text), Stdout: out, Stderr: out})
		err = keep.exec("script", res, err)
		if err != nil {
			return string(out.Bytes()), -1, nil, err
		}
		if res.TimedOut {
			return string(out.Bytes()), 124, res, fmt.Errorf("timed out after %v", limit)
		}
		return string(out.Bytes()), res.ExitCode, res, nil
	}
}

// runAgent lets the agent work on the broken VM, within the scenario's
// limits, and records how it stopped.
func (o *Options) runAgent(ctx context.Context, c *client.Client, sc *Scenario, run int, session string, script scriptFunc, keep *receiptKeeper, tr *tracer, r *TrialResult) {
	actx, cancel := context.WithTimeout(ctx, sc.AgentLimit)
	defer cancel()
	env := &Env{Instruction: sc.Instruction, MaxTurns: sc.MaxTurns, Solve: sc.Solve, Trace: tr.event,
		Shell: func(ctx context.Context, a shelltool.Args) shelltool.Outcome {
			return keep.shell(shelltool.Run(ctx, c, session, a))
		},
		Script: func(ctx context.Context, text []byte, limit time.Duration) (string, int, error) {
			out, code, _, err := script(ctx, text, limit)
			return out, code, err
		}}
	ta := time.Now()
	agent := o.NewAgent(run, r.Sampling)
	r.AgentResult = agent.Run(actx, env)
	if r.Stop != StopTimeout && actx.Err() != nil && ctx.Err() == nil {
		r.Stop = StopTimeout
	}
	r.AgentSeconds = math.Round(time.Since(ta).Seconds()*10) / 10
	tr.event("agent_stopped", map[string]any{"result": r.AgentResult, "seconds": r.AgentSeconds})
}

// verify runs the scenario's check and guards and compares the protected
// files with their hashes from before; it returns the harness errors.
func (o *Options) verify(ctx context.Context, sc *Scenario, script scriptFunc, before map[string]string, tr *tracer, r *TrialResult) []string {
	var harness []string
	for _, step := range []struct {
		phase string
		text  []byte
		ok    *bool
	}{{"check", sc.Check, &r.CheckPassed}, {"guard", sc.Guards, &r.GuardsPassed}} {
		vctx, cancel := context.WithTimeout(ctx, sc.VerifyLimit+30*time.Second)
		out, code, _, err := script(vctx, step.text, sc.VerifyLimit)
		cancel()
		tr.event(step.phase, map[string]any{"exit_code": code, "output": out, "error": errString(err)})
		checks, ok := ParseChecks(step.phase, out, code)
		if err != nil && code != 124 {
			harness = append(harness, fmt.Sprintf("%s: %v", step.phase, err))
		}
		r.Checks = append(r.Checks, checks...)
		*step.ok = ok && err == nil
	}
	if len(sc.Protect) == 0 {
		return harness
	}
	after, err := o.hashes(ctx, script, sc.Protect, sc.VerifyLimit)
	if err != nil {
		harness = append(harness, "protected files: "+err.Error())
	}
	for _, p := range sc.Protect {
		ok := err == nil && after[p] == before[p]
		cr := CheckResult{Phase: "protect", Name: p, OK: ok}
		if !ok && err == nil {
			cr.Detail = fmt.Sprintf("sha256 %.12s… → %.12s…", before[p], after[p])
			if after[p] == "" {
				cr.Detail = "removed"
			}
		}
		r.Checks = append(r.Checks, cr)
		r.GuardsPassed = r.GuardsPassed && ok
	}
	return harness
}

// judge sets the verdict from the checks, the guards, the harness errors
// and how the agent stopped.
func (r *TrialResult) judge(harness []string) {
	r.Resolved = len(harness) == 0 && r.CheckPassed && r.GuardsPassed
	switch {
	case r.Resolved:
		ttf := r.AgentSeconds
		r.TimeToFix = &ttf
	case len(harness) > 0:
		r.FailureMode, r.Error = FailHarness, strings.Join(harness, "; ")
	case r.Stop == StopError:
		r.FailureMode = FailAgent
	case !r.GuardsPassed:
		r.FailureMode = FailGuard
	case r.Stop == StopTimeout:
		r.FailureMode = FailTimeout
	case r.Stop == StopTurns:
		r.FailureMode = FailTurns
	default:
		r.FailureMode = FailNotFix
	}
}

type scriptFunc func(ctx context.Context, text []byte, limit time.Duration) (string, int, *wire.Result, error)

// hashes returns the SHA-256 of each path ("" for a missing file).
func (o *Options) hashes(ctx context.Context, script scriptFunc, paths []string, limit time.Duration) (map[string]string, error) {
	m := map[string]string{}
	if len(paths) == 0 {
		return m, nil
	}
	var b strings.Builder
	for _, p := range paths {
		fmt.Fprintf(&b, "if [ -f %s ]; then sha256sum < %s | cut -d' ' -f1; else echo missing; fi\n", shellQuote(p), shellQuote(p))
	}
	out, code, _, err := script(ctx, []byte(b.String()), limit)
	if err != nil || code != 0 {
		return nil, fmt.Errorf("exit %d %v: %s", code, errString(err), tail(out, 200))
	}
	lines := strings.Fields(out)
	if len(lines) != len(paths) {
		return nil, fmt.Errorf("unexpected output %q", tail(out, 200))
	}
	for i, p := range paths {
		if lines[i] != "missing" {
			m[p] = lines[i]
		}
	}
	return m, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

var checkLineRE = regexp.MustCompile(`^(PASS|FAIL) ([^:]{1,120}?)(?:: (.*))?$`)

// ParseChecks reads a check or guard script's report: lines "PASS name"
// and "FAIL name: detail" (lib.sh's pass and fail). The script passes
// when it exits 0 and reported no failure; a script that reported
// nothing is one check named after it.
func ParseChecks(phase, output string, exit int) ([]CheckResult, bool) {
	var out []CheckResult
	failed := false
	for _, line := range strings.Split(output, "\n") {
		m := checkLineRE.FindStringSubmatch(strings.TrimRight(line, "\r"))
		if m == nil {
			continue
		}
		cr := CheckResult{Phase: phase, Name: strings.TrimSpace(m[2]), OK: m[1] == "PASS", Detail: m[3]}
		failed = failed || !cr.OK
		out = append(out, cr)
	}
	ok := exit == 0 && !failed
	if exit != 0 && !failed {
		out = append(out, CheckResult{Phase: phase, Name: phase + " script", OK: false, Detail: "exit status " + strconv.Itoa(exit) + ": " + tail(output, 300)})
	}
	if len(out) == 0 {
		out = append(out, CheckResult{Phase: phase, Name: phase + " script", OK: ok})
	}
	return out, ok
}

// ReadResults reads a run's results.jsonl.
func ReadResults(dir string) ([]TrialResult, error) {
	f, err := os.Open(filepath.Join(dir, "results.jsonl"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []TrialResult
	dec := json.NewDecoder(f)
	for {
		var r TrialResult
		if err := dec.Decode(&r); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", f.Name(), len(out)+1, err)
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b TrialResult) int {
		if c := strings.Compare(a.Scenario, b.Scenario); c != 0 {
			return c
		}
		return a.Run - b.Run
	})
	return out, nil
}

// copiesMemory reads the mean RSS and PSS (MiB) of the copies' QEMUs, when
// this process can see them (a daemon of its own); zeros otherwise.
func copiesMemory(copies []wire.Session) (rss, pss float64) {
	n := 0
	for _, c := range copies {
		pid := qemuPid(c.VMID)
		if pid == 0 {
			continue
		}
		r, p, ok := procmem.Rollup(pid)
		if !ok {
			continue
		}
		rss, pss, n = rss+r, pss+p, n+1
	}
	if n == 0 {
		return 0, 0
	}
	return math.Round(rss/float64(n)*10) / 10, math.Round(pss/float64(n)*10) / 10
}

// qemuPid is the QEMU process of VM id (its command line names the VM's
// directory), or 0.
func qemuPid(id string) int {
	if id == "" {
		return 0
	}
	ents, _ := os.ReadDir("/proc")
	needle := []byte("/vms/" + id + "/")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && bytes.Contains(b, needle) {
			return pid
		}
	}
	return 0
}
