package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/cmd/vmgated/imagebuild"
	"github.com/vmgate/vmgate/gateway/wire"

	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/image"
)

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", errUsage, s)
	}
	return l, nil
}

func imageBuild(fs *pflag.FlagSet) runFunc {
	state := fs.String("state-dir", defaultStateDir(), "state directory")
	out := fs.String("out", "", "output directory (default STATE/image, or STATE/images/NAME with --name)")
	name := fs.String("name", "", "image name for profile.image (default: the default image)")
	force := fs.Bool("force", false, "rebuild even if an up-to-date image exists")
	pkgs := fs.String("packages", "", "extra Debian packages, comma-separated")
	suite := fs.String("suite", image.DefaultSuite, "Debian suite")
	mirror := fs.String("mirror", "", "Debian mirror URL (default: mmdebstrap's)")
	agent := fs.String("agent", "", "guest agent binary (default: vmgate-agent beside vmgated)")
	diskMiB := fs.Int("disk-size", 4096, "guest root filesystem size in MiB")
	level := fs.String("log-level", "info", "log level")
	return func(ctx context.Context, args []string) error {
		lvl, err := parseLogLevel(*level)
		if err != nil {
			return err
		}
		log := newLogger(os.Stderr, lvl)
		if *out, err = imageTarget(*state, *out, *name); err != nil {
			return err
		}
		var extra []string
		if *pkgs != "" {
			extra = strings.Split(*pkgs, ",")
		}
		var progress io.Writer
		if human(os.Stderr) {
			progress = os.Stderr
			log = newLogger(io.Discard, lvl)
		}
		res, err := imagebuild.Build(ctx, imagebuild.Options{
			OutDir: *out, Suite: *suite, Mirror: *mirror, ExtraPackages: extra,
			AgentPath: *agent, DiskSizeMiB: *diskMiB, Force: *force, Log: log, Progress: progress,
		})
		if err != nil {
			return err
		}
		m := res.Manifest
		state2 := "built"
		if res.Cached {
			state2 = "up to date"
		}
		fmt.Printf("image %s: %s (kernel %s, %d packages, base.qcow2 %d MiB)\n", state2, *out, m.KernelVersion, len(m.Packages), m.Artifacts[image.BaseFile].Size>>20)
		return nil
	}
}

func debugRun(fs *pflag.FlagSet) runFunc {
	state := fs.String("state-dir", defaultStateDir(), "state directory")
	imgDir := fs.String("image", "", "image directory (default STATE/image)")
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	mem := fs.Int("memory", 512, "guest memory in MiB")
	cpus := fs.Int("cpus", 1, "guest CPUs")
	disk := fs.Int("disk-mib", policy.DefaultDiskMiB, "what the guest may write to its disk, in MiB (as the policy's disk_mib)")
	timeout := fs.Duration("timeout", 0, "command time limit (0: none)")
	user := fs.String("user", "", "guest user: root (default) or agent")
	jailReport := fs.Bool("jail-report", false, "print the QEMU process's confinement (namespaces, uid map, caps, seccomp) to stderr")
	seccomp := fs.String("seccomp", "required", "jail seccomp filter: required or off (a logged relaxation)")
	cgroups := fs.String("cgroups", "auto", "jail cgroup: auto (use a delegated cgroup when there is one), required or off")
	level := fs.String("log-level", "warn", "log level")
	return func(ctx context.Context, args []string) error {
		if err := ensureStateDir(*state); err != nil {
			return exitWith(wire.ExitUsage, err)
		}
		if len(args) == 0 {
			return exitWith(wire.ExitUsage, fmt.Errorf("%w: debug run needs a program: vmgated debug run -- PROG ARGS…", errUsage))
		}
		lvl, err := parseLogLevel(*level)
		if err != nil {
			return exitWith(wire.ExitUsage, err)
		}
		if *disk < 1 {
			return exitWith(wire.ExitUsage, fmt.Errorf("%w: --disk-mib %d: want a positive number of MiB", errUsage, *disk))
		}
		a, err := vm.ParseAccel(*accel)
		if err != nil {
			return exitWith(wire.ExitUsage, err)
		}
		if *imgDir == "" {
			*imgDir = defaultImageDir(*state)
		}
		log := newLogger(os.Stderr, lvl)
		opts := vm.Options{Runtime: vm.Runtime{StateDir: *state, Accel: a, Log: log},
			ImageDir: *imgDir, MemoryMiB: *mem, CPUs: *cpus, DiskMiB: *disk, Seccomp: *seccomp}
		if err := resolveDirs(&opts, log); err != nil {
			return exitWith(wire.ExitVMFailed, err)
		}
		cgm, err := cgroup.OpenMode(*cgroups, cgroup.GroupName(opts.StateDir), log)
		if err != nil {
			return exitWith(wire.ExitInternal, err)
		}
		if cgm != nil {
			defer cgm.Close()
		}
		opts.Cgroups = cgm
		v, err := vm.Start(ctx, opts)
		if err != nil {
			return exitWith(wire.ExitVMFailed, err)
		}
		defer func() {
			if err := v.Close(); err != nil {
				log.Error("destroy vm", "err", err)
			}
		}()
		if *jailReport {
			rep, err := v.JailReport()
			if err != nil {
				return exitWith(wire.ExitVMFailed, err)
			}
			fmt.Fprintf(os.Stderr, "vmgated: jail: %s\n", rep)
		}
		var stdin io.Reader
		if !isTerminal(os.Stdin) {
			stdin = os.Stdin
		}
		t0 := time.Now()
		res, err := v.Exec(ctx, vm.ExecRequest{Argv: args, User: *user, Stdin: stdin, Stdout: os.Stdout, Stderr: os.Stderr, Timeout: *timeout})
		if err != nil {
			return exitWith(wire.ExitVMFailed, err)
		}
		log.Info("command finished", "exit", res.ExitCode, "signal", res.Signal, "ms", time.Since(t0).Milliseconds(), "boot_ms", v.BootDuration().Milliseconds())
		if res.TimedOut {
			fmt.Fprintf(os.Stderr, "vmgated: command timed out after %v and was killed\n", *timeout)
		}
		return exitWith(wire.ExitStatus(res.TimedOut, res.ShellExitCode()), nil)
	}
}
