package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/signum"
	"github.com/vmgate/vmgate/internal/tty"
)

// ExecRequest is one command to run in the VM.
type ExecRequest struct {
	// Argv is run without a shell. Use []string{"sh", "-c", s} for a shell.
	Argv []string
	Env  []string // KEY=VALUE
	Dir  string
	// User is the guest account: "" or "root", agentproto.UnprivilegedUser,
	// or, with agentproto.FeatureUsers, any account of the guest's (one
	// it does not have, or one other than root with uid or gid 0, ends
	// the command with 126 and a message naming it).
	User string

	Stdin          io.Reader // nil: empty stdin
	Stdout, Stderr io.Writer // nil: discarded

	// Timeout is the wall-clock limit; 0 means none (ctx still applies).
	Timeout time.Duration
	// OutputLimit caps the bytes delivered per stream; 0 means unlimited.
	// Output beyond it is read and discarded, so the guest never blocks.
	OutputLimit int64
	// PTY runs the command on a pseudo-terminal of the given size (stdout
	// and stderr then arrive merged on Stdout, as on a terminal).
	PTY *PTY
	// Signals, when non-nil, carries RFC 4254 signal names ("INT", "TERM")
	// to deliver to the command's process group while it runs.
	Signals <-chan string
	// Resize, when non-nil, carries new terminal sizes (Columns and Rows;
	// Term is ignored) of a PTY command while it runs.
	Resize <-chan PTY
	// KillGrace is how long the command may take to die after SIGKILL is
	// sent before the VM itself is killed (default 5s).
	KillGrace time.Duration
}

// PTY describes a requested pseudo-terminal.
type PTY struct {
	Term          string // default "xterm"
	Columns, Rows uint32 // default 80x24
}

// ExecResult is the outcome of a command.
type ExecResult struct {
	ExitCode int    // -1 when killed by a signal
	Signal   string // RFC 4254 name ("KILL", "TERM", …) or ""
	// TimedOut is set when Timeout expired and the command was killed.
	TimedOut        bool
	StdoutTruncated bool
	StderrTruncated bool
	StdoutBytes     int64 // bytes the guest produced, including discarded ones
	StderrBytes     int64
	Duration        time.Duration
}

// ShellExitCode maps the result to a shell-style code: the exit code, or
// 128+N for signal N.
func (r *ExecResult) ShellExitCode() int {
	if r.Signal != "" {
		return signum.ExitCode(r.Signal)
	}
	return r.ExitCode
}

// capWriter passes through at most limit bytes and counts the rest. Its
// counters may be read (counts) while a stream is still being copied.
type capWriter struct {
	w         io.Writer
	limit     int64 // 0: unlimited
	mu        sync.Mutex
	n         int64
	truncated bool
}

// counts returns the bytes written so far and whether some were dropped.
func (c *capWriter) counts() (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, c.truncated
}

// Write never fails and never holds the lock while the consumer writes (a
// slow consumer must not block counts). One goroutine writes at a time.
func (c *capWriter) Write(p []byte) (int, error) {
	total := len(p)
	c.mu.Lock()
	c.n += int64(total)
	w := c.w
	if w != nil && c.limit > 0 {
		room := c.limit - (c.n - int64(total))
		if room <= 0 {
			w, c.truncated = nil, true
		} else if int64(len(p)) > room {
			p, c.truncated = p[:room], true
		}
	}
	c.mu.Unlock()
	if w == nil {
		return total, nil
	}
	if _, err := w.Write(p); err != nil {
		// The consumer is gone: keep draining so the guest does not block.
		c.mu.Lock()
		c.w, c.truncated = nil, true
		c.mu.Unlock()
	}
	return total, nil
}

// ErrAgentUnresponsive reports a guest agent that stopped answering; its VM
// has been killed.
var ErrAgentUnresponsive = errors.New("guest agent unresponsive")

// controlTimeout bounds each control step of a command (opening its
// channel, the pty and exec requests) that a healthy agent answers in
// milliseconds; an agent that does not is given up, with its VM.
const controlTimeout = 30 * time.Second

// Exec runs req in the VM and waits for it to finish. A non-nil error means
// the command's outcome is unknown (VM died, channel failed, ctx ended); a
// timeout is not an error but ExecResult.TimedOut.
//
// Postcondition: Exec returns within req.Timeout + req.KillGrace + a
// second or so (each control step within controlTimeout), whatever the
// guest does; when the agent does not play along (stops reading, never
// answers a request, never lets the command die) the VM is killed.
func (v *VM) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	if err := v.checkExec(&req); err != nil {
		return nil, err
	}
	s := &execSession{v: v, req: req, start: time.Now()}
	if req.Timeout > 0 {
		s.deadline = s.start.Add(req.Timeout + req.KillGrace)
	}
	if err := s.open(ctx); err != nil {
		return nil, err
	}
	defer s.close()
	s.startSender()
	s.pump()
	return s.wait(ctx)
}

// checkExec validates a request and fills in its defaults.
func (v *VM) checkExec(req *ExecRequest) error {
	v.mu.Lock()
	closed := v.closed
	v.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if len(req.Argv) == 0 {
		return errors.New("exec: empty argv")
	}
	for _, a := range append(append([]string{}, req.Argv...), req.Env...) {
		if strings.IndexByte(a, 0) >= 0 {
			return errors.New("exec: argument or environment contains a NUL byte")
		}
	}
	if req.KillGrace == 0 {
		req.KillGrace = 5 * time.Second
	}
	return nil
}

// execSession is one command on one agent channel: open the channel
// (the command, its terminal), pump the streams, wait for the exit
// record. It is the host's side of the agent's session (package agent):
// one method per step.
type execSession struct {
	v     *VM
	req   ExecRequest
	start time.Time
	// deadline, with a time limit, is when even a command that would not
	// die must be over (Timeout + KillGrace); control steps end by then.
	deadline time.Time

	ch *agentconn.Channel

	// The sender (startSender): signals and sizes queue in ops (at most
	// sendQueue), a KILL in kill, which it takes first; stop ends it.
	ops  chan func() error
	kill chan struct{}
	stop chan struct{}

	stdout, stderr *capWriter
	streams        chan struct{} // closed at EOF of both output streams
}

// bounded runs a control step, which a healthy agent answers at once. When
// it has not returned within controlTimeout and by the session's deadline
// (or ctx ends, or QEMU exits) the agent is given up: the VM is killed,
// which ends the step, and the error says which step hung.
func (s *execSession) bounded(ctx context.Context, step string, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	limit := s.v.controlLimit()
	if !s.deadline.IsZero() {
		limit = max(min(limit, time.Until(s.deadline)), 0)
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	var why error
	select {
	case err := <-done:
		return err
	case <-s.v.exited:
		<-done
		return s.v.died("during " + step)
	case <-t.C:
		why = fmt.Errorf("exec: %w: it did not answer the %s within %v; vm killed", ErrAgentUnresponsive, step, limit.Round(time.Millisecond))
	case <-ctx.Done():
		why = fmt.Errorf("exec: %s: %w; vm killed", step, ctx.Err())
	}
	s.v.log.Warn("giving up the guest agent", "step", step, "err", why)
	_ = s.v.Kill()
	<-done
	return why
}

// open opens the command's channel; the agent answers once it has
// accepted the command (its start failures are exit codes, 126 and 127).
func (s *execSession) open(ctx context.Context) error {
	o := agentproto.Open{Spec: agentproto.ExecSpec{Argv: s.req.Argv, Env: s.req.Env, Dir: s.req.Dir, User: s.req.User}}
	if p := s.req.PTY; p != nil {
		o.PTY = &agentproto.PTY{Term: p.Term, Columns: p.Columns, Rows: p.Rows}
		if o.PTY.Term == "" {
			o.PTY.Term = "xterm"
		}
		if o.PTY.Columns == 0 || o.PTY.Rows == 0 {
			o.PTY.Columns, o.PTY.Rows = 80, 24
		}
	}
	err := s.bounded(ctx, "exec request", func() error {
		var err error
		s.ch, err = s.v.agent.Open(ctx, o)
		return err
	})
	var refused *agentconn.RefusedError
	switch {
	case errors.Is(err, ErrAgentUnresponsive) || errors.Is(err, ErrVMDied):
		return err
	case errors.As(err, &refused):
		return fmt.Errorf("exec: %w", err)
	case err != nil && s.v.agent.Err() != nil:
		return s.v.lost("before exec")
	case err != nil:
		return fmt.Errorf("exec: %w", err)
	}
	return nil
}

// pump copies stdin in and the output streams out.
func (s *execSession) pump() {
	s.stdout = &capWriter{w: s.req.Stdout, limit: s.req.OutputLimit}
	s.stderr = &capWriter{w: s.req.Stderr, limit: s.req.OutputLimit}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(s.stdout, s.ch) }()
	go func() { defer wg.Done(); _, _ = io.Copy(s.stderr, s.ch.Stderr()) }()
	go func() {
		if s.req.Stdin != nil {
			_, _ = io.Copy(s.ch, s.req.Stdin)
		}
		_ = s.ch.CloseWrite()
	}()
	s.streams = make(chan struct{})
	go func() { wg.Wait(); close(s.streams) }()
}

// sendQueue bounds the signals and terminal sizes waiting for the sender
// of one command; more are dropped (a client that sends them faster than
// the agent takes them gains nothing by their number).
const sendQueue = 16

// startSender starts the one goroutine that sends the command's signals
// and terminal sizes, so that the caller never waits on an agent that has
// stopped reading: each frame write has a deadline (agentconn's
// WriteTimeout), after which the connection, and the VM, are gone. A KILL
// goes before whatever else waits.
func (s *execSession) startSender() {
	s.ops, s.kill, s.stop = make(chan func() error, sendQueue), make(chan struct{}, 1), make(chan struct{})
	go func() {
		for {
			select {
			case <-s.kill:
				_ = s.ch.Signal("KILL")
				continue
			default:
			}
			select {
			case <-s.kill:
				_ = s.ch.Signal("KILL")
			case op := <-s.ops:
				_ = op()
			case <-s.stop:
				return
			}
		}
	}()
}

// send queues a signal or a terminal size for the sender; when the queue
// is full it is dropped.
func (s *execSession) send(op func() error) {
	select {
	case s.ops <- op:
	default:
		s.v.log.Debug("exec: signal or resize dropped: the agent is not taking them")
	}
}

// wait forwards signals and resizes, enforces the time limit and ctx, and
// returns the command's result once its exit record (and output) arrived.
func (s *execSession) wait(ctx context.Context) (*ExecResult, error) {
	var timeout <-chan time.Time
	if s.req.Timeout > 0 {
		t := time.NewTimer(s.req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	res := &ExecResult{}
	var killDeadline <-chan time.Time
	var ctxErr error
	kill := func() {
		select {
		case s.kill <- struct{}{}:
		default:
		}
		if killDeadline == nil {
			killDeadline = time.After(s.req.KillGrace)
		}
	}
	done := ctx.Done()
	streams := s.streams
	for {
		select {
		case <-s.ch.Exited():
			e, ok := s.ch.ExitStatus()
			if ok {
				s.drain(streams, killDeadline)
				s.fill(res, e)
				return res, ctxErr
			}
			if s.v.agent.Err() != nil {
				return nil, s.v.lost("during exec")
			}
			return nil, errors.New("exec: the agent closed the channel without an exit status")
		case <-streams:
			// EOF on both streams but no exit record yet: wait for it, or
			// for the connection to end (VM died).
			streams = nil
		case <-s.v.exited:
			return nil, s.v.died("during exec")
		case <-timeout:
			timeout = nil
			res.TimedOut = true
			s.v.log.Info("exec timed out, killing", "argv0", s.req.Argv[0], "timeout", s.req.Timeout)
			kill()
		case <-done:
			done = nil
			ctxErr = fmt.Errorf("exec: %w", ctx.Err())
			kill()
		case sig := <-s.req.Signals:
			if signum.IsRFC4254(sig) {
				s.send(func() error { return s.ch.Signal(sig) })
			}
		case sz := <-s.req.Resize:
			if s.req.PTY != nil && sz.Columns > 0 && sz.Rows > 0 && tty.SizeOK(sz.Columns, sz.Rows) {
				s.send(func() error { return s.ch.Resize(sz.Columns, sz.Rows) })
			}
		case <-killDeadline:
			s.v.log.Warn("command did not die after SIGKILL, killing the vm")
			_ = s.v.Kill()
			if ctxErr != nil {
				return nil, ctxErr
			}
			return nil, fmt.Errorf("exec: %w: the command did not end within %v of SIGKILL; vm killed", ErrAgentUnresponsive, s.req.KillGrace)
		}
	}
}

// drain waits for the output sent before the exit record (already queued)
// to reach EOF, unless it came first (streams is then nil): at most the
// kill grace, and never past a kill deadline already running.
func (s *execSession) drain(streams <-chan struct{}, killDeadline <-chan time.Time) {
	if streams == nil {
		return
	}
	t := time.NewTimer(s.req.KillGrace)
	defer t.Stop()
	select {
	case <-streams:
	case <-t.C:
	case <-killDeadline:
	}
}

// fill completes res from the exit record and the streams.
func (s *execSession) fill(res *ExecResult, e agentproto.Exit) {
	res.ExitCode, res.Signal = int(e.Status), e.Signal
	if e.Signal != "" {
		res.ExitCode = -1
	}
	res.Duration = time.Since(s.start)
	res.StdoutBytes, res.StdoutTruncated = s.stdout.counts()
	res.StderrBytes, res.StderrTruncated = s.stderr.counts()
}

// close stops the sender and closes the channel without waiting on an
// agent that has stopped reading (the close message could otherwise
// block until the write deadline).
func (s *execSession) close() {
	if s.stop != nil {
		close(s.stop)
	}
	done := make(chan struct{})
	go func() { _ = s.ch.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Second):
	}
}

func (v *VM) isDead() bool {
	select {
	case <-v.exited:
		return true
	case <-time.After(200 * time.Millisecond):
		return false
	}
}

// PutCommand is the guest command that extracts a file transfer's tar
// stream (on its stdin) at dest, and GetCommand the one that writes the
// tree at path as a tar stream to its stdout: the agent's put and get
// (agentproto.PutArgv, GetArgv), run with Exec.
func PutCommand(dest, top string, maxBytes int64, maxFiles int) []string {
	return agentproto.PutArgv(dest, top, maxBytes, maxFiles)
}

// GetCommand: see PutCommand.
func GetCommand(path string, maxBytes int64, maxFiles int) []string {
	return agentproto.GetArgv(path, maxBytes, maxFiles)
}

// CanTransfer reports whether the VM's agent has the put and get
// subcommands: an image built before them has an agent that would take
// them for a request to serve its port. It asks the agent, within
// controlTimeout and while ctx lasts.
func (v *VM) CanTransfer(ctx context.Context) (bool, error) {
	return v.Has(ctx, agentproto.FeatureTransfer)
}
