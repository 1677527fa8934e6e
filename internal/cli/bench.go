package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/bench"
	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/vm"
)

func benchExec(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("vmgated bench exec", flag.ContinueOnError)
	state := fs.String("state-dir", defaultStateDir(), "state directory (scratch VMs go in a temporary directory inside it)")
	imgDir := fs.String("image", "", "image directory (default STATE/image)")
	templateDir := fs.String("template-dir", "", "template directory (default STATE/templates; a template there is reused)")
	runs := fs.Int("runs", 10, "samples per latency figure")
	coldRuns := fs.Int("cold-runs", 2, "cold boots (each a full boot)")
	conc := fs.String("concurrency", "1,2,4", "comma-separated concurrency levels for throughput")
	pool := fs.Int("pool", 2, "pool size for the pooled figures")
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	from := fs.String("report", "", "print the text table of a JSON report saved earlier (--json) and exit")
	level := fs.String("log-level", "warn", "log level")
	lvl, err := parseFlags(fs, args, level)
	if err != nil {
		return err
	}
	if *from != "" {
		b, err := os.ReadFile(*from)
		if err != nil {
			return err
		}
		var rep bench.ExecReport
		if err := json.Unmarshal(b, &rep); err != nil {
			return fmt.Errorf("%s: %w", *from, err)
		}
		rep.WriteText(os.Stdout)
		return nil
	}
	a, err := vm.ParseAccel(*accel)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	levels, err := parseLevels(*conc)
	if err != nil {
		return fmt.Errorf("%w: --concurrency: %v", errUsage, err)
	}
	if *runs < 1 || *coldRuns < 1 || *pool < 1 {
		return fmt.Errorf("%w: --runs, --cold-runs and --pool must be at least 1", errUsage)
	}
	if *imgDir == "" {
		*imgDir = defaultImageDir(*state)
	}
	if *templateDir == "" {
		*templateDir = filepath.Join(*state, "templates")
	}
	rep, err := bench.Exec(ctx, bench.ExecOptions{
		ImageDir: *imgDir, WorkDir: *state, TemplateDir: *templateDir, Runs: *runs, ColdRuns: *coldRuns,
		Concurrency: levels, PoolSize: *pool, Accel: a, Log: newLogger(os.Stderr, lvl), Progress: os.Stderr,
	})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.WriteText(os.Stdout)
	return nil
}

// parseLevels parses "1,2,4".
func parseLevels(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("%q is not a concurrency from 1 to 64", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// imageWarm builds (or checks) the VM template of one shape ahead of the
// daemon, which otherwise builds it in the background at start.
func imageWarm(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("vmgated image warm", flag.ContinueOnError)
	state := fs.String("state-dir", defaultStateDir(), "state directory")
	imgDir := fs.String("image", "", "image directory (default STATE/image)")
	templateDir := fs.String("template-dir", "", "template directory (default STATE/templates)")
	mem := fs.Int("memory", vm.DefaultMemoryMiB, "guest memory in MiB")
	cpus := fs.Int("cpus", vm.DefaultCPUs, "guest CPUs")
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	cgroups := fs.String("cgroups", "auto", "jail cgroup: auto, required or off")
	level := fs.String("log-level", "info", "log level")
	lvl, err := parseFlags(fs, args, level)
	if err != nil {
		return err
	}
	a, err := vm.ParseAccel(*accel)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if *imgDir == "" {
		*imgDir = defaultImageDir(*state)
	}
	log := newLogger(os.Stderr, lvl)
	cgm, err := cgroup.OpenMode(*cgroups, cgroup.GroupName(*state), log)
	if err != nil {
		return err
	}
	if cgm != nil {
		defer cgm.Close()
	}
	t0 := time.Now()
	t, err := vm.EnsureTemplate(ctx, vm.Options{ImageDir: *imgDir, StateDir: *state, TemplateDir: *templateDir,
		MemoryMiB: *mem, CPUs: *cpus, Accel: a, Log: log, Cgroups: cgm})
	if err != nil {
		return err
	}
	defer t.Close()
	how := "up to date"
	if t.Built {
		how = "built"
	}
	fmt.Printf("%s: %s in %.1f s (%s, boot %d ms, state %d bytes, %d MiB of RAM data)\n", t, how, time.Since(t0).Seconds(), t.Dir,
		t.Meta.BootMillis, t.Meta.StateBytes, t.Meta.RAMDataBytes>>20)
	return nil
}
