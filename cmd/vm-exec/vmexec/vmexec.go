// Package vmexec is the vm-exec command: the client that runs a command in
// a disposable VM through vmgated with the command's own output streams
// and exit code, and its MCP server mode. It links the client side only
// (gateway/client, gateway/wire, cmd/vm-exec/mcpserver): no VM, jail, policy
// or network code, no cgo; it is the piece users copy into containers.
package vmexec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/vmgate/vmgate/cmd/vm-exec/mcpserver"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/names"
	"github.com/vmgate/vmgate/internal/version"
)

// vmexecOpts is the parsed vm-exec command line.
type vmexecOpts struct {
	socket, session, endSession, shell, dir string
	receipt                                 string
	timeout                                 time.Duration
	jsonOut, list, forceStdin, noStdin      bool
	pause                                   bool
	noNetwork, netLock                      bool
	netAllow                                []string
	forks                                   []string
	publish                                 string
	pub                                     client.PublishSpec
	tty, shellMode, help, version           bool
	env, envFiles                           []string
	secrets                                 []string
	argv                                    []string
	puts, gets                              []copySpec
	user, image                             string
	proc                                    procOpts
}

// flagSet defines vm-exec's flags on o. Parsing stops at the first
// argument that is not a flag (PROG): nothing after it is vm-exec's.
func (o *vmexecOpts) flagSet(puts, gets *[]string) *pflag.FlagSet {
	fs := pflag.NewFlagSet("vm-exec", pflag.ContinueOnError)
	fs.SetInterspersed(false)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	fs.StringVarP(&o.shell, "command", "c", "", "run the shell `STRING` (sh -c in the guest) instead of PROG ARGS…")
	fs.StringVar(&o.session, "session", "", "run in the caller's kept VM `NAME` (created on first use)")
	fs.DurationVar(&o.timeout, "timeout", 0, "time limit, e.g. 30s (default: the policy's)")
	fs.BoolVarP(&o.forceStdin, "interactive", "i", false, "send stdin even when it is a terminal (default: only when it is not)")
	fs.BoolVarP(&o.noStdin, "no-stdin", "n", false, "give the command an empty stdin, as ssh -n does")
	fs.BoolVarP(&o.tty, "tty", "t", false, "run on a pseudo-terminal in the VM (stderr merges into stdout; with -i on a terminal, raw mode)")
	fs.StringVarP(&o.dir, "workdir", "w", "", "working `DIR` in the guest (default: the image's WorkingDir, else the guest user's home)")
	fs.StringVarP(&o.dir, "directory", "C", "", "the same as --workdir `DIR`")
	fs.StringArrayVarP(&o.env, "env", "e", nil, "set `KEY=VALUE` in the guest, or KEY to pass its value here (repeatable; the policy must allow it)")
	fs.StringArrayVar(&o.secrets, "secret", nil, "give the command the policy's secret `NAME`: the variable NAME holds a placeholder the VM's network puts the value in for, on the way to the secret's hosts only (repeatable; docs/secrets.md)")
	fs.StringArrayVar(&o.envFiles, "env-file", nil, "read KEY=VALUE (or KEY) lines from `FILE`; # starts a comment (repeatable)")
	fs.StringArrayVar(puts, "put", nil, "copy a file or directory into the VM before the command: `LOCAL:GUESTPATH` (repeatable)")
	fs.StringArrayVar(gets, "get", nil, "copy a file or directory out of the VM after it: `GUESTPATH:LOCAL` (repeatable)")
	fs.BoolVar(&o.noNetwork, "no-network", false, "run without network, whatever the profile allows")
	fs.StringArrayVar(&o.netAllow, "net-allow", nil, "allow only the network rule `HOST:PORT` (*.DOMAIN:PORT, CIDR:PORT; PORT may be *), which must be within the profile's: anything else is refused (repeatable)")
	fs.BoolVar(&o.netLock, "net-lock", false, "with --session: lock the session's network to the RULES given as arguments (none: no network) for the rest of its life")
	fs.StringVar(&o.receipt, "receipt", "", "write the daemon's signed receipt of the command to `FILE` once it agrees with what was received (also of a denial; docs/security.md, \"Receipts\")")
	fs.BoolVar(&o.jsonOut, "json", false, "print one JSON result (with stdout and stderr) instead of streaming; with --list-sessions, JSON sessions")
	fs.BoolVar(&o.list, "list-sessions", false, "list the caller's sessions")
	fs.StringVar(&o.endSession, "end-session", "", "end the caller's session `NAME` (running or paused)")
	fs.BoolVar(&o.pause, "pause", false, "with --session: pause the session to disk (its VM is freed; its next command resumes it)")
	fs.StringArrayVar(&o.forks, "fork", nil, "with --session: make the new session `NEW`, a copy of the session's state now (repeatable)")
	fs.StringVar(&o.publish, "publish", "", "with --session: forward host connections on `[ADDR:]PORT:GUESTPORT` (ADDR 127.0.0.1 by default, PORT 0 a free one; or SOCKET_PATH:GUESTPORT) into the guest's port, until the session ends or this is stopped")
	fs.StringVarP(&o.user, "user", "u", "", "run as the guest user `NAME` (one of the profile's users; default: the image's configured user when it is one of them, else the profile's user)")
	fs.StringVar(&o.image, "image", "", "run in the image `NAME` (one of the profile's images; default: its image); with --session, the image of a new session: an existing one keeps its own, and another NAME is refused")
	o.proc.flags(fs)
	fs.StringVar(&o.socket, "socket", "", "gateway socket `PATH` (default $VMGATE_SOCKET, else "+wire.DefaultSocket+")")
	fs.BoolVarP(&o.help, "help", "h", false, "show this help")
	fs.BoolVar(&o.version, "version", false, "print the version")
	return fs
}

// usageError is a command line vm-exec cannot run.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// parseVMExec parses the vm-exec command line (pure; fuzzed).
func parseVMExec(args []string) (*vmexecOpts, error) {
	o := &vmexecOpts{}
	var puts, gets []string
	fs := o.flagSet(&puts, &gets)
	if err := fs.Parse(args); err != nil {
		return nil, usagef("%v", err)
	}
	if o.help || o.version {
		return o, nil
	}
	o.argv = fs.Args()
	if err := o.parseFiles(puts, gets); err != nil {
		return nil, err
	}
	shellSet := fs.Changed("command")
	if err := o.proc.parse(fs, o, shellSet, len(puts)+len(gets) > 0); err != nil {
		return nil, err
	}
	for _, n := range o.secrets {
		if !names.EnvVar(n) {
			return nil, usagef("--secret %q: must be %s", n, names.EnvVarRule)
		}
	}
	if fs.Changed("image") {
		switch {
		case !names.Image(o.image):
			return nil, usagef("--image %q: must be %s", o.image, names.ImageRule)
		case o.proc.op != "" && o.proc.op != procDetach || o.list || o.endSession != "" || o.netLock || o.pause || len(o.forks) > 0 || fs.Changed("publish"):
			return nil, usagef("--image chooses where a command runs: it takes no --list-sessions, --end-session, --net-lock, --pause, --fork, --publish or operation on background processes")
		}
	}
	switch {
	case o.proc.op != "" && o.proc.op != procDetach:
		return o, nil
	case o.list || o.endSession != "":
		if len(o.argv) > 0 || shellSet || o.receipt != "" {
			return nil, usagef("--list-sessions and --end-session take no command and no --receipt")
		}
	case o.netLock:
		switch {
		case o.session == "" || shellSet || o.noNetwork || o.pause || len(o.forks) > 0 || fs.Changed("publish") || o.receipt != "" || len(puts)+len(gets) > 0:
			return nil, usagef("--net-lock needs --session NAME and takes network rules: no command, --no-network, --pause, --fork, --publish, --receipt or files")
		}
		o.netAllow, o.argv = append(o.netAllow, o.argv...), nil
		return o, nil
	case o.pause || len(o.forks) > 0 || fs.Changed("publish"):
		switch {
		case o.session == "":
			return nil, usagef("--pause, --fork and --publish need --session NAME")
		case len(o.argv) > 0 || shellSet:
			return nil, usagef("--pause, --fork and --publish take no command")
		case o.pause && len(o.forks) > 0:
			return nil, usagef("--pause and --fork contradict each other: fork first, then pause")
		case fs.Changed("publish") && (o.pause || len(o.forks) > 0):
			return nil, usagef("--publish runs on its own: pause or fork with another vm-exec")
		}
		if fs.Changed("publish") {
			pub, err := client.ParsePublish(o.publish)
			if err != nil {
				return nil, &usageError{err.Error()}
			}
			o.pub = pub
		}
	case shellSet:
		if len(o.argv) > 0 {
			return nil, usagef("-c takes one shell string and no further arguments (got %q)", o.argv)
		}
		o.argv = []string{o.shell}
		o.shellMode = true
	case len(o.argv) == 0:
		return nil, usagef("no command given")
	}
	switch {
	case o.timeout < 0:
		return nil, usagef("--timeout must not be negative")
	case o.noStdin && o.forceStdin:
		return nil, usagef("-n and -i contradict each other")
	case o.noNetwork && len(o.netAllow) > 0:
		return nil, usagef("--no-network and --net-allow contradict each other")
	}
	// `cp` with one guest side is vmgate's copy (`vm-exec -- cp` never is).
	if fs.ArgsLenAtDash() != 0 && !o.shellMode {
		cp, err := parseCp(o)
		if err != nil {
			return nil, &usageError{err.Error()}
		}
		if cp && (len(puts)+len(gets) > 0 || o.tty || o.forceStdin || o.jsonOut) {
			return nil, usagef("cp takes no --put, --get, -t, -i or --json")
		}
	}
	return o, nil
}

// parseFiles parses the --put and --get values into o.
func (o *vmexecOpts) parseFiles(puts, gets []string) error {
	for _, v := range puts {
		p, err := parsePut(v)
		if err != nil {
			return &usageError{err.Error()}
		}
		o.puts = append(o.puts, p)
	}
	for _, v := range gets {
		g, err := parseGet(v)
		if err != nil {
			return &usageError{err.Error()}
		}
		o.gets = append(o.gets, g)
	}
	return nil
}

// Doc describes a command for its help text and its man page. vm-exec
// parses its own command line (parseVMExec) and prints its help from its
// Doc; cmd/mangen renders the man pages from the same Doc, so vm-exec links
// no command framework.
type Doc struct {
	Use, Short, Long string
	Flags            *pflag.FlagSet
	Subcommands      []Doc
}

// Describe is vm-exec's Doc.
func Describe() Doc {
	var puts, gets []string
	return Doc{
		Use:   "vm-exec [flags] [--] PROG [ARGS…]",
		Short: "Run a command in a disposable VM, as if it ran here",
		Long: `vm-exec runs PROG ARGS… in a fresh disposable VM (or in the session NAME) through vmgated,
with the command's own stdout, stderr and exit code. Flags are read up to PROG: everything
after it is the command's, so "vm-exec ls -h" runs "ls -h". Use -- before a PROG that
starts with a dash, or is named mcp, ps or cp.

  vm-exec [flags] -c 'SHELL STRING'
  vm-exec --image NAME [flags] PROG …   run in another of the profile's images (docs/images.md)
  vm-exec [--session NAME] cp LOCAL NAME:GUESTPATH     (or NAME:GUESTPATH LOCAL; docs/files.md)
  vm-exec --list-sessions [--json] | --end-session NAME
  vm-exec --session NAME --pause          pause the session to disk; its next command resumes it
  vm-exec --session NAME --fork NEW …     new sessions, each a copy of NAME's state now
  vm-exec --session NAME --publish [ADDR:]PORT:GUESTPORT    the guest's port on the host (or
                                          SOCKET_PATH:GUESTPORT), until the session ends
  vm-exec --session NAME --net-lock [RULE …]
                                          lock NAME's network to RULEs (none: no network) for good
  vm-exec --session NAME --detach PROG …  run PROG in the background of NAME: it outlives vm-exec,
                                          which prints its handle H at once (docs/sessions.md)
  vm-exec --session NAME --procs | --logs H [--follow] [--since N] | --attach H | --kill H
                                          [--signal SIG] | --wait H      its background processes
  vm-exec ps [--json]         the caller's live VMs and sessions (vmgated status)
  vm-exec mcp [--socket PATH] an MCP server on stdin/stdout (docs/agents.md)

Exit status: the command's, or 128+N when signal N killed it; vmgate's own outcomes are
above that range: 200 vmgate failed, 201 denied by policy, 202 busy, 203 timed out,
204 gateway unreachable, 205 VM failure, 206 file transfer failed (after a command that
succeeded), 207 invalid command line.`,
		Flags:       (&vmexecOpts{}).flagSet(&puts, &gets),
		Subcommands: []Doc{mcpDoc(new(string)), psDoc(new(bool), new(string))},
	}
}

// WriteHelp writes d as the command's help text.
func (d Doc) WriteHelp(w io.Writer) {
	if d.Long != "" {
		fmt.Fprintf(w, "%s\n\n", d.Long)
	} else {
		fmt.Fprintf(w, "%s\n\n", d.Short)
	}
	fmt.Fprintf(w, "Usage:\n  %s\n", d.Use)
	if len(d.Subcommands) > 0 {
		fmt.Fprintf(w, "\nCommands:\n")
		for _, c := range d.Subcommands {
			name, _, _ := strings.Cut(c.Use, " ")
			fmt.Fprintf(w, "  %-6s %s\n", name, c.Short)
		}
	}
	if d.Flags != nil && d.Flags.HasFlags() {
		fmt.Fprintf(w, "\nFlags:\n%s", d.Flags.FlagUsages())
	}
}

// Run runs the vm-exec command line and returns the process exit code.
// A first argument "mcp" or "ps" runs that (`vm-exec -- ps` runs a
// program called ps).
func Run(args []string) int {
	if len(args) > 0 {
		switch {
		case args[0] == "mcp":
			return vmexecMCP(args[1:])
		case isPS(args):
			return vmexecPS(args[1:])
		}
	}
	o, err := parseVMExec(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: %v\nRun 'vm-exec --help' for usage.\n", err)
		return wire.ExitUsage
	}
	switch {
	case o.help:
		Describe().WriteHelp(os.Stdout)
		return 0
	case o.version:
		fmt.Println("vm-exec " + version.Get().String())
		return 0
	}
	c := client.New(o.socket)
	ctx := context.Background()
	switch {
	case o.list:
		return listSessions(ctx, c, o.jsonOut)
	case o.endSession != "":
		if err := c.EndSession(ctx, o.endSession); err != nil {
			return reportErr(err)
		}
		return 0
	case o.pause:
		ss, err := c.PauseSession(ctx, o.session)
		if err != nil {
			return reportErr(err)
		}
		return printSessions([]wire.Session{*ss}, o.jsonOut)
	case len(o.forks) > 0:
		ss, err := c.ForkSession(ctx, o.session, o.forks)
		if err != nil {
			return reportErr(err)
		}
		return printSessions(ss, o.jsonOut)
	case o.pub.GuestPort != 0:
		return runPublish(ctx, c, o)
	case o.netLock:
		ss, err := c.LockSessionNet(ctx, o.session, o.netAllow)
		if err != nil {
			return reportErr(err)
		}
		return printSessions([]wire.Session{*ss}, o.jsonOut)
	}
	if err := resolveEnv(o, os.LookupEnv, os.ReadFile); err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: %v\n", err)
		return wire.ExitUsage
	}
	if o.proc.op != "" {
		return runProc(ctx, c, o)
	}
	return runExec(ctx, c, o)
}

func listSessions(ctx context.Context, c *client.Client, jsonOut bool) int {
	ss, err := c.Sessions(ctx)
	if err != nil {
		return reportErr(err)
	}
	return printSessions(ss, jsonOut)
}

// printSessions prints sessions a line each, or as JSON.
func printSessions(ss []wire.Session, jsonOut bool) int {
	if jsonOut {
		if ss == nil {
			ss = []wire.Session{}
		}
		_ = json.NewEncoder(os.Stdout).Encode(ss)
		return 0
	}
	for _, s := range ss {
		where := "vm=" + s.VMID
		if s.State == wire.SessionPaused {
			where = fmt.Sprintf("paused=%s disk=%dMiB", s.PausedAt.Format(time.RFC3339), s.DiskBytes>>20)
		}
		if len(s.Published) > 0 {
			where += "\tpublished=" + strings.Join(s.Published, ",")
		}
		if l := s.NetLock; l != nil {
			where += fmt.Sprintf("\tnet-lock=[%s]", strings.Join(l.Allow, " "))
		}
		fmt.Printf("%s\t%s\tprofile=%s\timage=%s\tidle-since=%s\texpires=%s\n", s.Name, where, s.Profile, s.Image, s.LastUsed.Format(time.RFC3339), s.ExpiresAt.Format(time.RFC3339))
	}
	return 0
}

func mcpDoc(socket *string) Doc {
	fs := subFlags("mcp")
	fs.StringVar(socket, "socket", "", "gateway socket `PATH` (default $VMGATE_SOCKET, else "+wire.DefaultSocket+")")
	return Doc{
		Use:   "mcp [--socket PATH]",
		Short: "Serve the Model Context Protocol on stdin/stdout",
		Long: `Serves the Model Context Protocol on stdin/stdout: tools exec_shell_command,
session_start, session_exec, session_write_file, session_read_file and session_end run
commands in disposable VMs through vmgated; receipt returns a command's signed receipt.
Sessions it started end when it exits, even by SIGKILL. See docs/agents.md.`,
		Flags: fs,
	}
}

// subFlags is the flag set of subcommand name, with its -h/--help.
func subFlags(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet("vm-exec "+name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	fs.BoolP("help", "h", false, "show this help")
	return fs
}

// parseSub parses a subcommand's arguments (it takes no positional
// ones): done is true when the caller is to exit with code (help shown,
// or a usage error reported).
func parseSub(d Doc, args []string) (done bool, code int) {
	name := "vm-exec " + strings.Fields(d.Use)[0]
	err := d.Flags.Parse(args)
	if err == nil && d.Flags.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", d.Flags.Arg(0))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\nRun '%s --help' for usage.\n", name, err, name)
		return true, wire.ExitUsage
	}
	if help, _ := d.Flags.GetBool("help"); help {
		d.WriteHelp(os.Stdout)
		return true, 0
	}
	return false, 0
}

// vmexecMCP runs `vm-exec mcp`: stdout carries the protocol, logs go to stderr.
func vmexecMCP(args []string) int {
	var socket string
	if done, code := parseSub(mcpDoc(&socket), args); done {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := mcpserver.New(mcpserver.Options{Client: client.New(socket), Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err := srv.ServeStdio(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec mcp: %v\n", err)
		return wire.ExitInternal
	}
	return 0
}

func runExec(ctx context.Context, c *client.Client, o *vmexecOpts) int {
	req := wire.ExecRequest{Argv: o.argv, Shell: o.shellMode, User: o.user, Image: o.image,
		Env: o.env, Secrets: o.secrets, Dir: o.dir, Session: o.session, TimeoutMS: o.timeout.Milliseconds(), Receipt: o.receipt != ""}
	if o.noNetwork || len(o.netAllow) > 0 {
		req.Net = &wire.NetLimit{Allow: o.netAllow}
	}
	var sio client.ExecIO
	if err := addTransfers(o, &req, &sio); err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: %v\n", err)
		return wire.ExitTransfer
	}
	if err := req.CheckText(); err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: %v\n", err)
		return wire.ExitUsage
	}
	var outBuf, errBuf bytes.Buffer
	if o.jsonOut {
		sio.Stdout, sio.Stderr = &outBuf, &errBuf
	} else {
		sio.Stdout, sio.Stderr = os.Stdout, os.Stderr
	}
	if len(o.argv) > 0 && !o.noStdin && (o.forceStdin || !term.IsTerminal(int(os.Stdin.Fd()))) {
		sio.Stdin = os.Stdin
	}
	if o.tty {
		req.TTY = &wire.TTY{Term: os.Getenv("TERM")}
		if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
			req.TTY.Cols, req.TTY.Rows = uint32(w), uint32(h)
			// The local terminal's new sizes follow (resize frames).
			stop := forwardResizes(&sio)
			defer stop()
		}
		if sio.Stdin != nil && term.IsTerminal(int(os.Stdin.Fd())) {
			if old, err := term.MakeRaw(int(os.Stdin.Fd())); err == nil {
				defer func() { _ = term.Restore(int(os.Stdin.Fd()), old) }()
			}
		}
	}
	// Ctrl-C / SIGTERM are forwarded to the command; a second one drops
	// the connection, which makes the gateway kill the command and its VM.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigc)
	fwd := make(chan string, 4)
	sio.Signals = fwd
	go func() {
		n := 0
		for s := range sigc {
			n++
			if n > 1 {
				cancel()
				return
			}
			name := map[os.Signal]string{os.Interrupt: "INT", syscall.SIGTERM: "TERM", syscall.SIGHUP: "HUP"}[s]
			select {
			case fwd <- name:
			default:
			}
		}
	}()
	sio.ReceiptNote = func(n string) { fmt.Fprintf(os.Stderr, "vm-exec: receipt: %s\n", n) }
	res, err := c.Exec(ctx, req, sio)
	if o.receipt != "" {
		if code, done := keepReceipt(o.receipt, res, err); done {
			return code
		}
	}
	if err != nil {
		return reportErr(err)
	}
	code := reportTransfers(res, res.ExitStatus())
	if o.jsonOut {
		out := struct {
			*wire.Result
			Stdout string `json:"stdout"`
			Stderr string `json:"stderr"`
		}{res, outBuf.String(), errBuf.String()}
		enc := json.NewEncoder(os.Stdout)
		_ = enc.Encode(out)
		return code
	}
	if res.TimedOut {
		fmt.Fprintf(os.Stderr, "vm-exec: timed out after %v; the command was killed\n", time.Duration(res.ExecMS)*time.Millisecond)
	}
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintf(os.Stderr, "vm-exec: output truncated by the policy's output limit (stdout %d bytes, stderr %d bytes produced)\n", res.StdoutBytes, res.StderrBytes)
	}
	return code
}

// forwardResizes sends the local terminal's size to sio.Resize at each
// SIGWINCH, until stop.
func forwardResizes(sio *client.ExecIO) (stop func()) {
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, syscall.SIGWINCH)
	sizes := make(chan wire.TTY, 1)
	sio.Resize = sizes
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-winch:
				if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
					select {
					case sizes <- wire.TTY{Cols: uint32(w), Rows: uint32(h)}:
					default: // one is on its way; the next SIGWINCH sends the latest
					}
				}
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(winch); close(done) }
}

// reportErr prints err and maps it to vm-exec's exit codes.
func reportErr(err error) int {
	fmt.Fprintf(os.Stderr, "vm-exec: %v\n", err)
	var ue *client.UnreachableError
	var ae *client.APIError
	var fe *client.ExecFailedError
	switch {
	case errors.As(err, &ue):
		return wire.ExitUnreachable
	case errors.As(err, &ae):
		return ae.Body.ExitCode()
	case errors.As(err, &fe):
		return fe.Body.ExitCode()
	}
	return wire.ExitInternal
}
