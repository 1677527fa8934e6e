package vmexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// Operations on a session's background processes (--detach, --procs,
// --logs, --attach, --kill, --wait): flags, as --pause is, so that
// `vm-exec --session S kill 1234` still runs the guest's own kill.
const (
	procDetach = "detach"
	procList   = "procs"
	procLogs   = "logs"
	procAttach = "attach"
	procKill   = "kill"
	procWait   = "wait"
)

// procOpts are the flags of background processes.
type procOpts struct {
	detach, list, follow bool
	logs, attach, kill   int64
	wait, since          int64
	signal               string
	op                   string // the operation asked for ("": none)
	handle               int64
}

func (p *procOpts) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&p.detach, "detach", false, "with --session: run the command in the background: it outlives vm-exec, which prints its handle at once")
	fs.BoolVar(&p.list, "procs", false, "with --session: list the session's background processes (--json: as JSON)")
	fs.Int64Var(&p.logs, "logs", 0, "with --session: print the output of background process `H` (stdout to stdout, stderr to stderr; --json: pages with offsets)")
	fs.BoolVar(&p.follow, "follow", false, "with --logs: go on as the process writes, until it ends")
	fs.Int64Var(&p.since, "since", 0, "with --logs: from output offset `N` (a page's next)")
	fs.Int64Var(&p.attach, "attach", 0, "with --session: background process `H`'s output live, and this stdin to it; exits with its status")
	fs.Int64Var(&p.kill, "kill", 0, "with --session: send background process `H` (its process group) a signal")
	fs.StringVar(&p.signal, "signal", "TERM", "with --kill: the signal `SIG` (TERM, KILL, INT, …)")
	fs.Int64Var(&p.wait, "wait", 0, "with --session: wait until background process `H` ends; exits with its status")
}

// parse checks the background process flags against the rest of o.
func (p *procOpts) parse(fs *pflag.FlagSet, o *vmexecOpts, shellSet, files bool) error {
	set := map[string]bool{procDetach: p.detach, procList: p.list, procLogs: fs.Changed("logs"), procAttach: fs.Changed("attach"),
		procKill: fs.Changed("kill"), procWait: fs.Changed("wait")}
	handles := map[string]int64{procLogs: p.logs, procAttach: p.attach, procKill: p.kill, procWait: p.wait}
	var ops []string
	for _, op := range []string{procDetach, procList, procLogs, procAttach, procKill, procWait} {
		if set[op] {
			ops = append(ops, "--"+op)
			p.op, p.handle = op, handles[op]
		}
	}
	switch {
	case len(ops) > 1:
		return usagef("%s contradict each other", strings.Join(ops, " and "))
	case p.op == "" && (p.follow || fs.Changed("since") || fs.Changed("signal")):
		return usagef("--follow and --since go with --logs, --signal with --kill")
	case p.op == "":
		return nil
	case o.session == "":
		return usagef("--%s needs --session NAME", p.op)
	case p.op != procLogs && (p.follow || fs.Changed("since")):
		return usagef("--follow and --since go with --logs")
	case p.op != procKill && fs.Changed("signal"):
		return usagef("--signal goes with --kill")
	case p.op != procDetach && p.handle <= 0 && p.op != procList:
		return usagef("--%s takes a process handle (a positive integer)", p.op)
	case p.since < 0:
		return usagef("--since must not be negative")
	case o.pause || len(o.forks) > 0 || fs.Changed("publish") || o.netLock || o.list || o.endSession != "":
		return usagef("--%s runs on its own: no --pause, --fork, --publish, --net-lock or session listing", p.op)
	case p.op == procDetach:
		if o.tty || files || o.receipt != "" {
			return usagef("--detach runs a command without -t, --put, --get or --receipt")
		}
		if len(o.argv) == 0 && !shellSet {
			return usagef("--detach needs a command")
		}
		return nil
	case len(o.argv) > 0 || shellSet || files || o.receipt != "":
		return usagef("--%s takes no command, files or --receipt", p.op)
	}
	return nil
}

// runProc runs the background process operation of o.
func runProc(ctx context.Context, c *client.Client, o *vmexecOpts) int {
	p := o.proc
	switch p.op {
	case procDetach:
		req := wire.ExecRequest{Argv: o.argv, Shell: o.shellMode, User: o.user, Image: o.image, Env: o.env, Secrets: o.secrets, Dir: o.dir, TimeoutMS: o.timeout.Milliseconds(),
			Stdin: o.forceStdin}
		if o.noNetwork || len(o.netAllow) > 0 {
			req.Net = &wire.NetLimit{Allow: o.netAllow}
		}
		if err := req.CheckText(); err != nil {
			fmt.Fprintf(os.Stderr, "vm-exec: %v\n", err)
			return wire.ExitUsage
		}
		pr, err := c.StartProc(ctx, o.session, req)
		if err != nil {
			return reportErr(err)
		}
		if o.jsonOut {
			_ = json.NewEncoder(os.Stdout).Encode(pr)
		} else {
			fmt.Println(pr.Handle)
		}
		return 0
	case procList:
		ps, err := c.Procs(ctx, o.session)
		if err != nil {
			return reportErr(err)
		}
		printProcs(os.Stdout, ps, o.jsonOut)
		return 0
	case procLogs:
		return procOutput(ctx, c, o.session, p.handle, p.since, p.follow, o.jsonOut)
	case procKill:
		if err := c.ProcSignal(ctx, o.session, p.handle, p.signal); err != nil {
			return reportErr(err)
		}
		return 0
	case procWait:
		return waitProc(ctx, c, o.session, p.handle, o.timeout)
	case procAttach:
		return attachProc(ctx, c, o.session, p.handle, !o.noStdin)
	}
	return wire.ExitInternal
}

// printProcs prints processes a line each, or as JSON.
func printProcs(w io.Writer, ps []wire.Proc, jsonOut bool) {
	if jsonOut {
		if ps == nil {
			ps = []wire.Proc{}
		}
		_ = json.NewEncoder(w).Encode(ps)
		return
	}
	for _, p := range ps {
		state := p.State
		if code, ok := p.ExitStatus(); ok {
			state = fmt.Sprintf("exited %d", code)
			if p.Signal != "" {
				state = "killed by " + p.Signal
			}
			if p.TimedOut {
				state += " (timed out)"
			}
		}
		ended := ""
		if !p.Ended.IsZero() {
			ended = " ended=" + p.Ended.Format(time.RFC3339)
		}
		fmt.Fprintf(w, "%d\tpid=%d\tuser=%s\t%s\tstarted=%s%s\tout=%d err=%d\t%s\n", p.Handle, p.PID, p.User, state,
			p.Started.Format(time.RFC3339), ended, p.StdoutBytes, p.StderrBytes, strings.Join(p.Argv, " "))
	}
}

// procOutput prints process h's output from since: each stream to its
// own, or (jsonOut) each page as a JSON line.
func procOutput(ctx context.Context, c *client.Client, session string, h, since int64, follow, jsonOut bool) int {
	enc := json.NewEncoder(os.Stdout)
	err := c.ProcLogs(ctx, session, h, since, 0, follow, func(p wire.ProcOutput) error {
		if jsonOut {
			return enc.Encode(p)
		}
		if p.Dropped > 0 {
			fmt.Fprintf(os.Stderr, "vm-exec: %d bytes of the process's output are no longer kept (sessions.process_buffer)\n", p.Dropped)
		}
		return writeChunks(p.Chunks)
	})
	if err != nil {
		return reportErr(err)
	}
	return 0
}

// writeChunks writes output chunks to this process's stdout and stderr.
func writeChunks(cs []wire.ProcChunk) error {
	for _, ch := range cs {
		w := os.Stdout
		if ch.Stream == wire.StreamStderr {
			w = os.Stderr
		}
		if _, err := w.Write(ch.Data); err != nil {
			return err
		}
	}
	return nil
}

// waitProc waits until process h ends (at most timeout, 0: as long as it
// takes) and exits with its status, as vm-exec does for a command.
func waitProc(ctx context.Context, c *client.Client, session string, h int64, timeout time.Duration) int {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	for {
		left := time.Duration(0)
		if d, ok := ctx.Deadline(); ok {
			left = time.Until(d)
		}
		p, err := c.ProcWait(ctx, session, h, left)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				fmt.Fprintf(os.Stderr, "vm-exec: process %d still runs after %v\n", h, timeout)
				return wire.ExitTimedOut
			}
			return reportErr(err)
		}
		if code, ok := p.ExitStatus(); ok {
			return code
		}
		if ctx.Err() != nil || (timeout > 0 && left <= time.Second) {
			fmt.Fprintf(os.Stderr, "vm-exec: process %d still runs after %v\n", h, timeout)
			return wire.ExitTimedOut
		}
	}
}

// attachProc prints process h's output live from now and sends this
// process's stdin to its input (when input is set and the process
// takes it), until it ends; it exits with its status. Interrupting
// vm-exec detaches: the process goes on.
func attachProc(ctx context.Context, c *client.Client, session string, h int64, input bool) int {
	ps, err := c.Procs(ctx, session)
	if err != nil {
		return reportErr(err)
	}
	var cur *wire.Proc
	for i := range ps {
		if ps[i].Handle == h {
			cur = &ps[i]
		}
	}
	if cur == nil {
		fmt.Fprintf(os.Stderr, "vm-exec: session %s has no background process %d\n", session, h)
		return wire.ExitInternal
	}
	ctx, cancel := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	if input && cur.StdinOpen {
		go sendInput(ctx, c, session, h, os.Stdin)
	}
	if err := c.ProcLogs(ctx, session, h, cur.Next, 0, true, func(p wire.ProcOutput) error { return writeChunks(p.Chunks) }); err != nil {
		if ctx.Err() != nil {
			return 0 // detached: it goes on
		}
		return reportErr(err)
	}
	return waitProc(context.Background(), c, session, h, 0)
}

// sendInput copies r to process h's input, then closes it at r's end.
func sendInput(ctx context.Context, c *client.Client, session string, h int64, r io.Reader) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if c.ProcInput(ctx, session, h, buf[:n], false) != nil {
				return
			}
		}
		if err != nil {
			_ = c.ProcInput(ctx, session, h, nil, true)
			return
		}
	}
}
