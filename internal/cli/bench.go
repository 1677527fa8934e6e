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

	"github.com/vmgate/vmgate/internal/bench"
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
	level := fs.String("log-level", "warn", "log level")
	lvl, err := parseFlags(fs, args, level)
	if err != nil {
		return err
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
