package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/version"
	"github.com/vmgate/vmgate/vm"
)

// runFunc runs a command with its positional arguments, once its flags
// (defined on the command's flag set) are parsed.
type runFunc func(ctx context.Context, args []string) error

// errUsage is wrapped by errors about the command line: they exit
// wire.ExitUsage.
var errUsage = errors.New("invalid command line")

// exitError carries a command's exit code (debug run: the guest's).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

// exitWith ends a command with code, reporting err (if any) first.
func exitWith(code int, err error) error {
	if code == 0 && err == nil {
		return nil
	}
	return &exitError{code: code, err: err}
}

// usageArgs wraps an argument check so that its errors are usage errors.
func usageArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return nil
	}
}

// verb makes a leaf command whose flags define registers and whose run it
// returns.
func verb(use, short, long string, args cobra.PositionalArgs, define func(*pflag.FlagSet) runFunc) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Long: long, Args: usageArgs(args)}
	run := define(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, args []string) error { return run(cmd.Context(), args) }
	return cmd
}

// group makes a command that only holds others: alone it shows its help,
// with an unknown subcommand it says so and suggests the nearest.
func group(use, short string, subs ...*cobra.Command) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, SuggestionsMinimumDistance: 2, Args: func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
		if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return fmt.Errorf("%w: %s", errUsage, msg)
	}, RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	cmd.AddCommand(subs...)
	return cmd
}

// qemuVersion is the first line of the QEMU found's --version, for
// vmgated --version.
func qemuVersion() string {
	path, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return "QEMU: not found in PATH"
	}
	out, err := exec.Command(path, "--version").Output()
	if err != nil {
		return "QEMU: " + path + ": " + err.Error()
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return "QEMU: " + path + ": " + line
}

// Command is vmgated's command tree.
func Command() *cobra.Command {
	root := &cobra.Command{
		Use:   "vmgated",
		Short: "The vmgate daemon and admin tool: commands in disposable VMs",
		Long: `vmgated runs the vmgate gateway (serve), builds and imports guest images, checks
policies and audit logs, shows the daemon's state, and benchmarks. See README.md.

Exit status: 0, 1 for a failure the message explains, 207 for an invalid command line
(vmgate's own codes are above a guest command's: docs/protocol.md); debug run exits
with its command's status; receipt verify exits 0 valid, 1 invalid, 2 for an invalid
command line or no key to trust, as verifiers do.`,
		Version:       version.Get().String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cobra.AddTemplateFunc("qemuVersion", qemuVersion)
	root.SetVersionTemplate("vmgated {{.Version}}\n{{qemuVersion}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return fmt.Errorf("%w: %v", errUsage, err) })
	root.PersistentFlags().StringVar(&logFormat, "log-format", "auto", "logs and progress: auto (for a person on a terminal, JSON lines otherwise), text or json")
	root.PersistentPreRunE = func(*cobra.Command, []string) error { return checkLogFormat() }
	debug := verb("run [flags] -- PROG [ARGS…]", "Run one command in one VM, without a daemon", "", cobra.MinimumNArgs(1), debugRun)
	debug.Flags().SetInterspersed(false)
	root.AddCommand(
		verb("serve", "Run the gateway: exec requests on the socket, each in a fresh VM", "", cobra.NoArgs, serve),
		verb("status", "Show the daemon's VMs, sessions, queue and pools", statusLong, cobra.NoArgs, status),
		group("policy", "Check policies", verb("check FILE", "Validate a policy and explain what it allows", "", cobra.ExactArgs(1), policyCheck)),
		group("audit", "Check and rotate audit logs",
			verb("verify FILE|DIR…", "Check audit files' hash chain, signed checkpoints and rotated files' links", verifyLong, cobra.MinimumNArgs(1), auditVerify),
			verb("rotate", "Move the daemon's audit log aside and continue the chain in a new file", "", cobra.NoArgs, auditRotate)),
		receiptCommand(),
		group("image", "Build, import, list and warm guest images",
			verb("build", "Build a guest image (Debian, mmdebstrap)", "", cobra.NoArgs, imageBuild),
			verb("import [flags] SOURCE", "Make an image from a rootfs tarball, docker save archive or OCI layout", importLong, cobra.ExactArgs(1), imageImport),
			verb("pull [flags] REF", "Make an image from a registry's image (tag or digest)", pullLong, cobra.ExactArgs(1), imagePull),
			verb("list", "List the images: name, kernel, size, templates, reference, digest, platform", "", cobra.NoArgs, imageList),
			verb("warm", "Make the VM templates that fresh VMs are restored from", "", cobra.NoArgs, imageWarm)),
		group("e2b", "Keys of the E2B door (docs/e2b.md)",
			group("key", "Add keys to the E2B keys file",
				verb("add", "Make an API key for a profile and add it to the keys file", e2bKeyAddLong, cobra.NoArgs, e2bKeyAdd))),
		group("debug", "Debugging aids", debug),
		group("bench", "Benchmarks (docs/benchmarks.md, docs/scenarios.md)",
			verb("exec", "Exec-path benchmark: fresh-VM latency, throughput, memory", "", cobra.NoArgs, benchExec),
			verb("compare [flags] NEW.json…", "Compare exec reports (--json) of runs with a baseline build's (--base)", "", cobra.MinimumNArgs(1), benchCompare),
			verb("agent", "Agent benchmark: can an LLM fix a broken server?", "", cobra.NoArgs, benchAgent),
			verb("report DIR", "Write report.html and report.md of a bench agent run", "", cobra.ExactArgs(1), benchReport)),
	)
	return root
}

const verifyLong = `Checks each file's hash chain and, for several files (oldest first) or a directory (its
audit* files in chain order; .gz ones too), that each file continues the one before it.
A missing, reordered or changed file is named. Compare the newest file's head with
vmgated status (audit_head) to notice a truncation at its end.

Checkpoint records sign the chain with the daemon's receipt key; each signature is
checked. With --key (the output of vmgated receipt key; repeat it for keys used before a
rotation) only those keys are accepted and at least one checkpoint is required: a log
rewritten by someone without the key then fails. Records after the last checkpoint are
not signed yet, and are counted. docs/security.md, "Receipts", says what this proves.`

const importLong = `SOURCE is a root filesystem tarball, a docker save archive or an OCI image layout.

Unpacks a root filesystem tarball (compressed or not, such as docker export writes), a
docker save archive, or an OCI image layout (a directory or its tar; an index gives its
linux/amd64 image), and adds the same kernel and initramfs as a built image, the agent, a
resolver and a user agent; the agent is the root's init. An image's layers are applied in
order with their whiteouts, each checked against its digest. Set-user-ID and set-group-ID
bits are cleared unless --keep-setid; device nodes are skipped. Needs root. An import that
fails leaves nothing behind. See docs/images.md.`

const pullLong = `Fetches an image from a registry over HTTPS (plain HTTP to loopback only): a tag or a
digest, Docker Hub's short names (python:3.12-slim), credentials from the Docker config file
or its credential helpers, a proxy from HTTPS_PROXY and NO_PROXY. An index gives its
linux/amd64 image. The layers stream, checked against their digests, into the same unpacking
as image import; nothing but the image is stored. The name defaults to the repository's last
element. Bounded by --timeout, a minute of a registry's silence, and the import's size and
entry bounds. Needs root. See docs/images.md.`

// Vmgated runs the vmgated command line and returns the process exit code.
func Vmgated(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := Command()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	return exitCode(err)
}

// exitCode reports err and maps it to vmgated's exit status. vmgated's
// commands are the operator's, who is shown a failed VM's diagnostics
// (the ends of QEMU's log and of the guest's console) with its error.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(os.Stderr, "vmgated: %s\n", vm.Details(ee.err))
		}
		return ee.code
	}
	fmt.Fprintf(os.Stderr, "vmgated: %s\n", vm.Details(err))
	if errors.Is(err, errUsage) || strings.HasPrefix(err.Error(), "unknown command") {
		fmt.Fprintln(os.Stderr, "Run 'vmgated --help' for usage.")
		return wire.ExitUsage
	}
	return 1
}
