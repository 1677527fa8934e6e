// Package vmexec is the vm-exec command: the client that runs a command in
// a disposable VM through vmgated with the command's own output streams
// and exit code, and its MCP server mode. It links the client side only
// (gateway/client, gateway/wire, internal/mcpserver): no VM, jail, policy
// or network code, no cgo; it is the piece users copy into containers.
package vmexec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/mcpserver"
)

const vmexecUsage = `usage: vm-exec [flags] [--] PROG ARGS…
       vm-exec [flags] -c 'SHELL STRING'
       vm-exec [--session NAME] cp LOCAL NAME:GUESTPATH | cp NAME:GUESTPATH LOCAL
       vm-exec --list-sessions | --end-session NAME
       vm-exec mcp [--socket PATH]     (an MCP server on stdin/stdout; docs/agents.md)
Runs PROG in a fresh disposable VM (or in session NAME) through vmgated.
Flags:
  --socket PATH     gateway socket (default $VMGATE_SOCKET or /run/vmgate/vmgate.sock)
  --timeout D       time limit, e.g. 30s (default: the policy's)
  --session NAME    run in the caller's kept VM NAME (created on first use)
  --json            print one JSON result object (with stdout/stderr) instead of streaming
  -i                send stdin even when it is a terminal (default: only when it is not)
  -t                run on a pseudo-terminal in the VM (stderr merges into stdout); with -i and a
                    terminal on stdin, the local terminal is put in raw mode meanwhile
  -C DIR            working directory in the guest
  -e KEY=VALUE      environment variable (repeatable; the policy must allow it)
  --put LOCAL:GUESTPATH  copy a file or directory into the VM before the command (repeatable)
  --get GUESTPATH:LOCAL  copy a file or directory out of the VM after it (repeatable)
  cp copies in a session, as docker cp does (":GUESTPATH" with --session); see docs/files.md.
Exit status: the command's, 128+N for signal N, or
  201 denied by policy, 202 busy, 203 timed out, 204 gateway unreachable, 205 VM failure,
  206 file transfer failed (after a command that succeeded), 200 other.
`

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return fmt.Sprint(*m) }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// vmexecOpts is the parsed vm-exec command line.
type vmexecOpts struct {
	socket, session, endSession, shell, dir string
	timeout                                 time.Duration
	jsonOut, list, forceStdin, shellMode    bool
	tty                                     bool
	env                                     multiFlag
	argv                                    []string
	puts, gets                              []copySpec
}

// parseVMExec parses the vm-exec command line (pure; fuzzed).
func parseVMExec(args []string) (*vmexecOpts, error) {
	o := &vmexecOpts{}
	fs := flag.NewFlagSet("vm-exec", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.socket, "socket", "", "")
	fs.DurationVar(&o.timeout, "timeout", 0, "")
	fs.StringVar(&o.session, "session", "", "")
	fs.StringVar(&o.endSession, "end-session", "", "")
	fs.BoolVar(&o.list, "list-sessions", false, "")
	fs.BoolVar(&o.jsonOut, "json", false, "")
	fs.BoolVar(&o.forceStdin, "i", false, "")
	fs.BoolVar(&o.tty, "t", false, "")
	fs.StringVar(&o.shell, "c", "", "")
	fs.StringVar(&o.dir, "C", "", "")
	fs.Var(&o.env, "e", "")
	var puts, gets multiFlag
	fs.Var(&puts, "put", "")
	fs.Var(&gets, "get", "")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	for _, v := range puts {
		p, err := parsePut(v)
		if err != nil {
			return nil, err
		}
		o.puts = append(o.puts, p)
	}
	for _, v := range gets {
		g, err := parseGet(v)
		if err != nil {
			return nil, err
		}
		o.gets = append(o.gets, g)
	}
	o.argv = fs.Args()
	shellSet := false
	fs.Visit(func(f *flag.Flag) { shellSet = shellSet || f.Name == "c" })
	switch {
	case o.list || o.endSession != "":
		if len(o.argv) > 0 || shellSet {
			return nil, errors.New("--list-sessions and --end-session take no command")
		}
	case shellSet:
		if len(o.argv) > 0 {
			return nil, errors.New("-c takes one shell string and no further arguments")
		}
		o.argv = []string{o.shell}
		o.shellMode = true
	case len(o.argv) == 0:
		return nil, errors.New("no command given")
	}
	// `cp` with one guest side is vmgate's copy (`vm-exec -- cp` never is).
	if dashdash := len(args) > len(o.argv) && args[len(args)-len(o.argv)-1] == "--"; !dashdash && !o.shellMode {
		cp, err := parseCp(o)
		if err != nil {
			return nil, err
		}
		if cp && (len(puts)+len(gets) > 0 || o.tty || o.forceStdin || o.jsonOut) {
			return nil, errors.New("cp takes no --put, --get, -t, -i or --json")
		}
	}
	if o.timeout < 0 {
		return nil, errors.New("--timeout must not be negative")
	}
	return o, nil
}

// Run runs the vm-exec command line and returns the process exit code.
// A first argument "mcp" runs the MCP server (`vm-exec -- mcp` runs a
// program called mcp).
func Run(args []string) int {
	if len(args) > 0 && args[0] == "mcp" {
		return vmexecMCP(args[1:])
	}
	for _, a := range args {
		if a == "-h" || a == "--help" || a == "-help" {
			fmt.Fprint(os.Stdout, vmexecUsage)
			return 0
		}
		if a == "--" {
			break
		}
	}
	o, err := parseVMExec(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: %v\n%s", err, vmexecUsage)
		return wire.ExitUsage
	}
	c := client.New(o.socket)
	ctx := context.Background()
	switch {
	case o.list:
		ss, err := c.Sessions(ctx)
		if err != nil {
			return reportErr(err)
		}
		for _, s := range ss {
			fmt.Printf("%s\tvm=%s\tprofile=%s\tidle-since=%s\texpires=%s\n", s.Name, s.VMID, s.Profile, s.LastUsed.Format(time.RFC3339), s.ExpiresAt.Format(time.RFC3339))
		}
		return 0
	case o.endSession != "":
		if err := c.EndSession(ctx, o.endSession); err != nil {
			return reportErr(err)
		}
		return 0
	}
	return runExec(ctx, c, o)
}

const mcpUsage = `usage: vm-exec mcp [--socket PATH]
Serves the Model Context Protocol on stdin/stdout: tools exec_shell_command,
session_start, session_exec and session_end run commands in disposable VMs
through vmgated. Sessions it started end when stdin closes. See docs/agents.md.
`

// vmexecMCP runs `vm-exec mcp`: stdout carries the protocol, logs go to stderr.
func vmexecMCP(args []string) int {
	fs := flag.NewFlagSet("vm-exec mcp", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	socket := fs.String("socket", "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(os.Stdout, mcpUsage)
			return 0
		}
		fmt.Fprintf(os.Stderr, "vm-exec mcp: %v\n%s", err, mcpUsage)
		return wire.ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "vm-exec mcp: unexpected arguments %q\n%s", fs.Args(), mcpUsage)
		return wire.ExitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := mcpserver.New(mcpserver.Options{Client: client.New(*socket), Log: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err := srv.ServeStdio(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec mcp: %v\n", err)
		return wire.ExitInternal
	}
	return 0
}

func runExec(ctx context.Context, c *client.Client, o *vmexecOpts) int {
	req := wire.ExecRequest{Argv: o.argv, Shell: o.shellMode,
		Env: o.env, Dir: o.dir, Session: o.session, TimeoutMS: o.timeout.Milliseconds()}
	var sio client.ExecIO
	if err := addTransfers(o, &req, &sio); err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: %v\n", err)
		return wire.ExitTransfer
	}
	var outBuf, errBuf bytes.Buffer
	if o.jsonOut {
		sio.Stdout, sio.Stderr = &outBuf, &errBuf
	} else {
		sio.Stdout, sio.Stderr = os.Stdout, os.Stderr
	}
	if len(o.argv) > 0 && (o.forceStdin || !term.IsTerminal(int(os.Stdin.Fd()))) {
		sio.Stdin = os.Stdin
	}
	if o.tty {
		req.TTY = &wire.TTY{Term: os.Getenv("TERM")}
		if w, h, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
			req.TTY.Cols, req.TTY.Rows = uint32(w), uint32(h)
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
	res, err := c.Exec(ctx, req, sio)
	if err != nil {
		return reportErr(err)
	}
	code := res.ShellExitCode()
	if res.TimedOut {
		code = wire.ExitTimedOut
	}
	code = reportTransfers(res, code)
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
