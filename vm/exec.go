package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/internal/signum"
	"github.com/vmgate/vmgate/internal/sshmsg"
	"github.com/vmgate/vmgate/vm/agentproto"
)

// ExecRequest is one command to run in the VM.
type ExecRequest struct {
	// Argv is run without a shell. Use []string{"sh", "-c", s} for a shell.
	Argv []string
	Env  []string // KEY=VALUE
	Dir  string
	User string // "" or "root", or agentproto.UnprivilegedUser

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

// capWriter passes through at most limit bytes and counts the rest.
type capWriter struct {
	w         io.Writer
	limit     int64 // 0: unlimited
	n         int64
	truncated bool
}

func (c *capWriter) Write(p []byte) (int, error) {
	total := len(p)
	c.n += int64(total)
	if c.w == nil {
		return total, nil
	}
	if c.limit > 0 {
		room := c.limit - (c.n - int64(total))
		if room <= 0 {
			c.truncated = true
			return total, nil
		}
		if int64(len(p)) > room {
			p = p[:room]
			c.truncated = true
		}
	}
	if _, err := c.w.Write(p); err != nil {
		// The consumer is gone: keep draining so the guest does not block.
		c.w = nil
		c.truncated = true
	}
	return total, nil
}

// Exec runs req in the VM and waits for it to finish. A non-nil error means
// the command's outcome is unknown (VM died, channel failed, ctx ended); a
// timeout is not an error but ExecResult.TimedOut.
func (v *VM) Exec(ctx context.Context, req ExecRequest) (*ExecResult, error) {
	v.mu.Lock()
	closed := v.closed
	v.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if len(req.Argv) == 0 {
		return nil, errors.New("exec: empty argv")
	}
	for _, a := range append(append([]string{}, req.Argv...), req.Env...) {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, errors.New("exec: argument or environment contains a NUL byte")
		}
	}
	if req.KillGrace == 0 {
		req.KillGrace = 5 * time.Second
	}
	start := time.Now()
	ch, reqs, err := v.client.OpenChannel("session", nil)
	if err != nil {
		if v.isDead() {
			return nil, v.died("before exec")
		}
		return nil, fmt.Errorf("exec: open session: %w", err)
	}
	defer ch.Close()

	// Exit records arrive as channel requests.
	type exit struct {
		code   int
		signal string
	}
	exitc := make(chan exit, 1)
	reqsDone := make(chan struct{})
	go func() {
		defer close(reqsDone)
		for r := range reqs {
			switch r.Type {
			case sshmsg.ExitStatus:
				var p sshmsg.ExitStatusMsg
				if ssh.Unmarshal(r.Payload, &p) == nil {
					select {
					case exitc <- exit{code: int(p.Status)}:
					default:
					}
				}
			case sshmsg.ExitSignal:
				var p sshmsg.ExitSignalMsg
				if ssh.Unmarshal(r.Payload, &p) == nil {
					select {
					case exitc <- exit{code: -1, signal: p.Signal}:
					default:
					}
				}
			}
			if r.WantReply {
				_ = r.Reply(false, nil)
			}
		}
	}()

	if p := req.PTY; p != nil {
		term, cols, rows := p.Term, p.Columns, p.Rows
		if term == "" {
			term = "xterm"
		}
		if cols == 0 || rows == 0 {
			cols, rows = 80, 24
		}
		// RFC 4254 §6.2: term, columns, rows, width px, height px, modes.
		ok, err := ch.SendRequest(sshmsg.PtyReq, true, ssh.Marshal(sshmsg.PtyRequest{Term: term, Columns: cols, Rows: rows}))
		if err != nil || !ok {
			return nil, fmt.Errorf("exec: pty request refused (%v)", err)
		}
	}
	spec := agentproto.ExecSpec{Argv: req.Argv, Env: req.Env, Dir: req.Dir, User: req.User}
	js, _ := json.Marshal(spec)
	ok, err := ch.SendRequest(agentproto.ExecRequest, true, ssh.Marshal(agentproto.ExecPayload{JSON: string(js)}))
	if err != nil {
		if v.isDead() {
			return nil, v.died("during exec")
		}
		return nil, fmt.Errorf("exec: %w", err)
	}
	if !ok {
		// The agent explains a refusal on stderr and keeps the session open:
		// take what arrives promptly, then close.
		msgc := make(chan []byte, 1)
		go func() {
			buf := make([]byte, 4096)
			n, _ := ch.Stderr().Read(buf)
			msgc <- buf[:n]
		}()
		var msg []byte
		select {
		case msg = <-msgc:
		case <-time.After(500 * time.Millisecond):
		}
		return nil, fmt.Errorf("exec: agent refused the request: %s", strings.TrimSpace(string(msg)))
	}

	stdout := &capWriter{w: req.Stdout, limit: req.OutputLimit}
	stderr := &capWriter{w: req.Stderr, limit: req.OutputLimit}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _, _ = io.Copy(stdout, ch) }()
	go func() { defer wg.Done(); _, _ = io.Copy(stderr, ch.Stderr()) }()
	go func() {
		if req.Stdin != nil {
			_, _ = io.Copy(ch, req.Stdin)
		}
		_ = ch.CloseWrite()
	}()
	streams := make(chan struct{})
	go func() { wg.Wait(); close(streams) }()

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	res := &ExecResult{}
	var killDeadline <-chan time.Time
	var ctxErr error
	kill := func() {
		_, _ = ch.SendRequest(sshmsg.Signal, false, ssh.Marshal(sshmsg.SignalRequest{Signal: "KILL"}))
		killDeadline = time.After(req.KillGrace)
	}
	done := ctx.Done()
	for {
		select {
		case e := <-exitc:
			// Output sent before the exit record is already queued; wait for
			// EOF unless it came first (streams is then nil).
			if streams != nil {
				select {
				case <-streams:
				case <-time.After(req.KillGrace):
				}
			}
			res.ExitCode, res.Signal = e.code, e.signal
			res.Duration = time.Since(start)
			res.StdoutTruncated, res.StderrTruncated = stdout.truncated, stderr.truncated
			res.StdoutBytes, res.StderrBytes = stdout.n, stderr.n
			if ctxErr != nil {
				return res, ctxErr
			}
			return res, nil
		case <-streams:
			// EOF on both streams but no exit record yet: wait for it, or for
			// the connection to end (VM died).
			streams = nil
		case <-v.exited:
			return nil, v.died("during exec")
		case <-reqsDone:
			reqsDone = nil
			select {
			case e := <-exitc:
				exitc <- e // handled by the exit case on the next iteration
				continue
			default:
			}
			if v.isDead() {
				return nil, v.died("during exec")
			}
			return nil, errors.New("exec: the agent closed the session without an exit status")
		case <-timeout:
			timeout = nil
			res.TimedOut = true
			v.log.Info("exec timed out, killing", "argv0", req.Argv[0], "timeout", req.Timeout)
			kill()
		case <-done:
			done = nil
			ctxErr = fmt.Errorf("exec: %w", ctx.Err())
			kill()
		case sig := <-req.Signals:
			if signum.IsRFC4254(sig) {
				_, _ = ch.SendRequest(sshmsg.Signal, false, ssh.Marshal(sshmsg.SignalRequest{Signal: sig}))
			}
		case sz := <-req.Resize:
			if req.PTY != nil && sz.Columns > 0 && sz.Rows > 0 && sshmsg.TermSizeOK(sz.Columns, sz.Rows) {
				_, _ = ch.SendRequest(sshmsg.WindowChange, false, ssh.Marshal(sshmsg.WindowChangeRequest{Columns: sz.Columns, Rows: sz.Rows}))
			}
		case <-killDeadline:
			v.log.Warn("command did not die after SIGKILL, killing the vm")
			_ = v.Kill()
			if ctxErr != nil {
				return nil, ctxErr
			}
			return nil, fmt.Errorf("exec: command did not die within %v of SIGKILL; vm killed", req.KillGrace)
		}
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
