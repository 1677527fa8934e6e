package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/vmgate/vmgate/gateway/wire"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/image"
)

const vmgatedUsage = `usage:
  vmgated serve [--config FILE | --builtin-policy] [--socket PATH] [--image DIR] [--state-dir DIR] [--allow-root]
                [--max-vms N] [--queue N] [--queue-wait D] [--grace D] [--audit-log FILE]
  vmgated policy check FILE
  vmgated audit verify FILE
  vmgated image build [--name NAME | --out DIR] [--force] [--packages P,…] [--suite S] [--agent PATH]
  vmgated image import --name NAME [--out DIR] [--force] [--disk-size MiB] [--agent PATH] ROOTFS.tar
  vmgated image list [--state-dir DIR] [--image DIR] [--json]
  vmgated image warm [--image DIR] [--state-dir DIR] [--template-dir DIR] [--config FILE | --builtin-policy]
                     [--memory MiB] [--cpus N] [--network]
  vmgated debug run [--image DIR] [--state-dir DIR] [--accel auto|kvm|tcg] [--memory MiB]
                    [--cpus N] [--timeout D] [--user U] [--jail-report] [--seccomp required|off] -- PROG ARGS…
  vmgated bench exec [--image DIR] [--state-dir DIR] [--runs N] [--cold-runs N] [--concurrency 1,2,4]
                     [--pool N] [--json | --report FILE]
  vmgated bench agent [--scenarios DIR] [--agent openai|oracle|noop] [--endpoint URL] [--model NAME]
                      [--runs K] [--parallel P] [--seed S] [--out DIR] [--only ID,…] [--stream]
                      [--temperature T] [--top-p P] [--max-tokens N] [--socket PATH] [--memory MiB]
  vmgated bench report DIR
`

// Vmgated runs the vmgated command line and returns the process exit code.
func Vmgated(args []string) int {
	if len(args) < 1 {
		fmt.Fprint(os.Stderr, vmgatedUsage)
		return wire.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	code := 0
	verb := args[0]
	if len(args) > 1 && (verb == "policy" || verb == "audit" || verb == "image" || verb == "debug" || verb == "bench") {
		verb += " " + args[1]
	}
	switch verb {
	case "serve":
		err = serve(ctx, args[1:])
	case "policy check":
		err = policyCheck(args[2:])
	case "audit verify":
		err = auditVerify(args[2:])
	case "image build":
		err = imageBuild(ctx, args[2:])
	case "image import":
		err = imageImport(ctx, args[2:])
	case "image list":
		err = imageList(args[2:])
	case "image warm":
		err = imageWarm(ctx, args[2:])
	case "debug run":
		code, err = debugRun(ctx, args[2:])
	case "bench exec":
		err = benchExec(ctx, args[2:])
	case "bench agent":
		err = benchAgent(ctx, args[2:])
	case "bench report":
		err = benchReport(args[2:])
	case "help", "-h", "--help":
		fmt.Fprint(os.Stdout, vmgatedUsage)
		return 0
	default:
		fmt.Fprintf(os.Stderr, "vmgated: unknown command %q\n%s", verb, vmgatedUsage)
		return wire.ExitUsage
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vmgated: %v\n", err)
		if errors.Is(err, flag.ErrHelp) || errors.Is(err, errUsage) {
			return wire.ExitUsage
		}
		if code == 0 {
			code = 1
		}
	}
	return code
}

var errUsage = errors.New("usage")

// parseFlags parses a verb's flags, which take no positional arguments,
// and the log level flag they define.
func parseFlags(fs *flag.FlagSet, args []string, level *string) (slog.Level, error) {
	if err := fs.Parse(args); err != nil {
		return 0, err
	}
	if fs.NArg() > 0 {
		return 0, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	return parseLogLevel(*level)
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%w: --log-level %q: want debug, info, warn or error", errUsage, s)
	}
	return l, nil
}

func imageBuild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("vmgated image build", flag.ContinueOnError)
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
	lvl, err := parseFlags(fs, args, level)
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
	if isTerminal(os.Stderr) {
		progress = os.Stderr
		log = newLogger(io.Discard, lvl)
	}
	res, err := image.Build(ctx, image.Options{
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

func debugRun(ctx context.Context, args []string) (int, error) {
	fs := flag.NewFlagSet("vmgated debug run", flag.ContinueOnError)
	state := fs.String("state-dir", defaultStateDir(), "state directory")
	imgDir := fs.String("image", "", "image directory (default STATE/image)")
	accel := fs.String("accel", "auto", "accelerator: auto, kvm or tcg")
	mem := fs.Int("memory", 512, "guest memory in MiB")
	cpus := fs.Int("cpus", 1, "guest CPUs")
	timeout := fs.Duration("timeout", 0, "command time limit (0: none)")
	user := fs.String("user", "", "guest user: root (default) or agent")
	jailReport := fs.Bool("jail-report", false, "print the QEMU process's confinement (namespaces, uid map, caps, seccomp) to stderr")
	seccomp := fs.String("seccomp", "required", "jail seccomp filter: required or off (a logged relaxation)")
	cgroups := fs.String("cgroups", "auto", "jail cgroup: auto (use a delegated cgroup when there is one), required or off")
	level := fs.String("log-level", "warn", "log level")
	if err := fs.Parse(args); err != nil {
		return wire.ExitUsage, err
	}
	if err := needStateDir(*state); err != nil {
		return wire.ExitUsage, err
	}
	if fs.NArg() == 0 {
		return wire.ExitUsage, fmt.Errorf("%w: debug run needs a program: vmgated debug run -- PROG ARGS…", errUsage)
	}
	lvl, err := parseLogLevel(*level)
	if err != nil {
		return wire.ExitUsage, err
	}
	a, err := vm.ParseAccel(*accel)
	if err != nil {
		return wire.ExitUsage, err
	}
	if *imgDir == "" {
		*imgDir = defaultImageDir(*state)
	}
	log := newLogger(os.Stderr, lvl)
	cgm, err := cgroup.OpenMode(*cgroups, cgroup.GroupName(*state), log)
	if err != nil {
		return wire.ExitInternal, err
	}
	if cgm != nil {
		defer cgm.Close()
	}
	v, err := vm.Start(ctx, vm.Options{ImageDir: *imgDir, StateDir: *state, MemoryMiB: *mem, CPUs: *cpus, Accel: a, Log: log, Seccomp: *seccomp, Cgroups: cgm})
	if err != nil {
		return wire.ExitVMFailed, err
	}
	defer func() {
		if err := v.Close(); err != nil {
			log.Error("destroy vm", "err", err)
		}
	}()
	if *jailReport {
		rep, err := v.JailReport()
		if err != nil {
			return wire.ExitVMFailed, err
		}
		fmt.Fprintf(os.Stderr, "vmgated: jail: %s\n", rep)
	}
	var stdin io.Reader
	if !isTerminal(os.Stdin) {
		stdin = os.Stdin
	}
	t0 := time.Now()
	res, err := v.Exec(ctx, vm.ExecRequest{Argv: fs.Args(), User: *user, Stdin: stdin, Stdout: os.Stdout, Stderr: os.Stderr, Timeout: *timeout})
	if err != nil {
		return wire.ExitVMFailed, err
	}
	log.Info("command finished", "exit", res.ExitCode, "signal", res.Signal, "ms", time.Since(t0).Milliseconds(), "boot_ms", v.BootDuration().Milliseconds())
	if res.TimedOut {
		fmt.Fprintf(os.Stderr, "vmgated: command timed out after %v and was killed\n", *timeout)
		return wire.ExitTimedOut, nil
	}
	return res.ShellExitCode(), nil
}
