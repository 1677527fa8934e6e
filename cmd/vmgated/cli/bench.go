package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/cmd/vmgated/bench"
	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

func benchExec(fs *pflag.FlagSet) runFunc {
	state := fs.String("state-dir", defaultStateDir(), "state directory (scratch VMs go in a temporary directory inside it)")
	imgDir := fs.String("image", "", "image directory (default STATE/image)")
	templateDir := fs.String("template-dir", "", "template directory (default STATE/templates; a template there is reused)")
	runs := fs.Int("runs", 10, "samples per latency figure")
	coldRuns := fs.Int("cold-runs", 2, "cold boots (each a full boot)")
	conc := fs.String("concurrency", "1,2,4", "comma-separated concurrency levels for throughput")
	pool := fs.Int("pool", 2, "pool size for the pooled figures")
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	tbSize := fs.Int("tcg-tb-size", 0, "TCG translation buffer per VM in MiB (0: QEMU's default)")
	aslr := fs.String("guest-aslr", vm.GuestASLRAuto, "guests' address space randomisation, as the policy's isolate.guest_aslr: auto or on")
	ahead := fs.Int("ahead", gateway.DefaultAhead, "clones launched ahead per shape in the daemons (as vmgated serve --ahead)")
	sessionMiB := fs.Int("session-mib", 100, "MiB of files the session of the pause and fork figures writes")
	forkIdle := fs.Int("fork-idle", 8, "idle copies of one fork point whose memory is measured")
	only := fs.StringSlice("only", nil, "measure only these parts, comma-separated: "+strings.Join(bench.Parts, ", ")+" (default all)")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	from := fs.String("report", "", "print the text table of a JSON report saved earlier (--json) and exit")
	level := fs.String("log-level", "warn", "log level")
	return func(ctx context.Context, args []string) error {
		lvl, err := levelAndState(*level, *state)
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
		if *runs < 1 || *coldRuns < 1 || *pool < 1 || *sessionMiB < 1 || *forkIdle < 1 {
			return fmt.Errorf("%w: --runs, --cold-runs, --pool, --session-mib and --fork-idle must be at least 1", errUsage)
		}
		if _, err := vm.ParseGuestASLR(*aslr); err != nil {
			return fmt.Errorf("%w: --guest-aslr: %v", errUsage, err)
		}
		if err := bench.CheckParts(*only); err != nil {
			return fmt.Errorf("%w: --only: %v", errUsage, err)
		}
		if *imgDir == "" {
			*imgDir = defaultImageDir(*state)
		}
		log := newLogger(os.Stderr, lvl)
		dirs := vm.Options{Runtime: vm.Runtime{StateDir: *state, TemplateDir: *templateDir}, ImageDir: *imgDir}
		if err := resolveDirs(&dirs, log); err != nil {
			return err
		}
		rep, err := bench.Exec(ctx, bench.ExecOptions{
			ImageDir: dirs.ImageDir, WorkDir: dirs.StateDir, TemplateDir: dirs.TemplateDir, Runs: *runs, ColdRuns: *coldRuns,
			Concurrency: levels, PoolSize: *pool, Accel: a, TBSizeMiB: *tbSize, GuestASLR: *aslr, Ahead: *ahead, SessionFileMiB: *sessionMiB, ForkIdle: *forkIdle, Only: *only,
			Log: log, Progress: progressTo(log),
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

// imageWarm builds (or checks) VM templates ahead of the daemon, which
// otherwise builds them in the background at start and on first use: the
// shapes of the policy (the daemon's), or the one shape the flags name.
func imageWarm(fs *pflag.FlagSet) runFunc {
	state := fs.String("state-dir", defaultStateDir(), "state directory")
	imgDir := fs.String("image", "", "image directory (default STATE/image)")
	templateDir := fs.String("template-dir", "", "template directory (default STATE/templates)")
	config := fs.String("config", "", "policy whose VM shapes to warm (default "+DefaultConfig+" if it exists, else the embedded default policy)")
	builtin := fs.Bool("builtin-policy", false, "warm the shapes of the embedded default policy")
	mem := fs.Int("memory", 0, "warm one shape: guest memory in MiB (instead of the policy's shapes)")
	cpus := fs.Int("cpus", 0, "warm one shape: guest CPUs")
	network := fs.Bool("network", false, "warm one shape: VMs with a NIC")
	disk := fs.Int("disk-mib", 0, "warm one shape: the guest's disk limit in MiB (default the policy's built-in disk_mib)")
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	cgroups := fs.String("cgroups", "auto", "jail cgroup: auto, required or off")
	level := fs.String("log-level", "info", "log level")
	return func(ctx context.Context, args []string) error {
		lvl, err := levelAndState(*level, *state)
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
		var shapes []policy.Shape
		one := *mem != 0 || *cpus != 0 || *disk != 0 || *network
		if one && (*config != "" || *builtin) {
			return fmt.Errorf("%w: --memory/--cpus/--disk-mib/--network name one shape; --config and --builtin-policy warm the policy's shapes", errUsage)
		}
		// The policy (the daemon's) says how templates are made (its
		// isolate.guest_aslr) and, unless one shape is named, which.
		pol, err := loadPolicyFile(*config, *builtin)
		if err != nil {
			return err
		}
		if one {
			shapes = []policy.Shape{{MemoryMiB: cmp.Or(*mem, vm.DefaultMemoryMiB), CPUs: cmp.Or(*cpus, vm.DefaultCPUs), DiskMiB: cmp.Or(*disk, policy.DefaultDiskMiB), Network: *network}}
		} else {
			shapes = pol.Shapes()
		}
		log := newLogger(os.Stderr, lvl)
		dirs := vm.Options{Runtime: vm.Runtime{StateDir: *state, TemplateDir: *templateDir}, ImageDir: *imgDir}
		if err := resolveDirs(&dirs, log); err != nil {
			return err
		}
		cgm, err := cgroup.OpenMode(*cgroups, cgroup.GroupName(dirs.StateDir), log)
		if err != nil {
			return err
		}
		if cgm != nil {
			defer cgm.Close()
		}
		hc := vm.HostConfig{Runtime: vm.Runtime{StateDir: dirs.StateDir, TemplateDir: dirs.TemplateDir, Accel: a, GuestASLR: pol.GuestASLR(), Log: log}, ImageDir: dirs.ImageDir}
		for _, sh := range shapes {
			// Each shape on its own image, as the daemon makes its VMs.
			dir, err := hc.ImageDirOf(sh.Image)
			if err == nil && sh.Image != "" && sh.Image != vm.DefaultImage {
				dir, err = vm.ResolveDir(dir)
			}
			if err != nil {
				return err
			}
			opts := vm.Options{Runtime: hc.Runtime, ImageDir: dir, MemoryMiB: sh.MemoryMiB, CPUs: sh.CPUs, DiskMiB: sh.DiskMiB, Cgroups: cgm}
			if sh.Network {
				// The template's network allows nothing: it only gives the
				// guest its lease.
				opts.Network = &netstack.Config{Log: log}
			}
			t0 := time.Now()
			t, err := vm.EnsureTemplate(ctx, opts)
			if err != nil {
				return err
			}
			how := "up to date"
			if t.Built {
				how = "built"
			}
			nic := ""
			if sh.Network {
				nic = ", with a NIC"
			}
			fmt.Printf("%s%s: %s in %.1f s (%s, boot %d ms, state %d bytes, %d MiB of RAM data)\n", t, nic, how, time.Since(t0).Seconds(), t.Dir,
				t.Meta.BootMillis, t.Meta.StateBytes, t.Meta.RAMDataBytes>>20)
			_ = t.Close()
		}
		return nil
	}
}

// loadPolicyFile loads the policy vmgated serve would: file, else the
// default file when it exists, else the built-in one.
func loadPolicyFile(file string, builtin bool) (*policy.Policy, error) {
	switch {
	case builtin && file != "":
		return nil, fmt.Errorf("%w: --builtin-policy and --config exclude each other", errUsage)
	case builtin:
		return policy.Default(), nil
	case file != "":
		return policy.Load(file)
	}
	p, err := policy.Load(DefaultConfig)
	if errors.Is(err, os.ErrNotExist) {
		return policy.Default(), nil
	}
	return p, err
}

// benchCompare compares saved exec reports (bench exec --json): the
// runs of a baseline build (--base, repeated or comma-separated) against
// the runs given as arguments, figure by figure. With --fail it exits 1
// when a figure is worse than --threshold.
func benchCompare(fs *pflag.FlagSet) runFunc {
	base := fs.StringSlice("base", nil, "reports of the baseline build's runs (required)")
	threshold := fs.Float64("threshold", 15, "percent worse at which a figure is flagged")
	fail := fs.Bool("fail", false, "exit 1 if a figure is flagged")
	asJSON := fs.Bool("json", false, "print the comparison as JSON")
	return func(_ context.Context, args []string) error {
		if len(*base) == 0 || *threshold < 0 {
			return fmt.Errorf("%w: --base names at least one report, --threshold is not negative", errUsage)
		}
		read := func(paths []string) ([]map[string]float64, error) {
			var out []map[string]float64
			for _, p := range paths {
				b, err := os.ReadFile(p)
				if err != nil {
					return nil, err
				}
				f, err := bench.Figures(b)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", p, err)
				}
				out = append(out, f)
			}
			return out, nil
		}
		b, err := read(*base)
		if err != nil {
			return err
		}
		n, err := read(args)
		if err != nil {
			return err
		}
		rows := bench.Compare(b, n, *threshold)
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			if err := enc.Encode(rows); err != nil {
				return err
			}
		} else {
			bench.WriteComparison(os.Stdout, rows, len(b), len(n))
		}
		if *fail {
			for _, r := range rows {
				if r.Regressed {
					return &exitError{code: 1, err: fmt.Errorf("%s is %.1f%% worse than the baseline", r.Figure, r.WorsePct)}
				}
			}
		}
		return nil
	}
}
