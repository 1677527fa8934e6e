package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/tty"
)

// waitDelay bounds how long a finished command's output is still awaited
// when background processes keep its stdout, stderr or terminal open.
const waitDelay = time.Second

// session is one channel: it runs exactly one command, takes the host's
// signals and terminal sizes while it runs, and reports how it ended.
type session struct {
	ch     *agentconn.Channel
	log    *slog.Logger
	lookup lookupUserFunc // the account database (nil: user.Lookup)

	pty  *ptyState
	proc *process // the started command, nil if none was started

	io sync.WaitGroup // goroutines copying input to the command
}

// ptyState is the pseudo-terminal the host asked for.
type ptyState struct {
	ptmx *os.File // master side, used by the agent
	tty  *os.File // slave side until the command has been started
	term string
}

// process is a started command.
type process struct {
	cmd  *exec.Cmd
	pgid int
	// reaped is closed once the command has exited and been reaped,
	// before its end is reported: from then on its process group holds
	// only what it left running in the background, which outlives it as
	// it would outlive a command of a shell. done is closed once its end
	// has been reported to the host.
	reaped, done chan struct{}
}

// serveSession runs the command of a new channel, then serves the host's
// events until the host closes the channel or the connection is lost. If
// the command still runs then, its process group is killed. It returns
// once the command has been reaped and every goroutine of the session has
// finished.
func serveSession(log *slog.Logger, ch *agentconn.Channel, o agentproto.Open, lookup lookupUserFunc) {
	s := &session{ch: ch, log: log, lookup: lookup}
	if !s.begin(o) {
		return
	}
	for {
		e, ok := ch.NextEvent()
		if !ok {
			break
		}
		s.handle(e)
	}
	s.finish()
}

// handle takes one event of the host.
func (s *session) handle(e agentconn.Event) {
	switch {
	case e.Signal != "":
		s.signal(e.Signal)
	case s.pty != nil && tty.SizeOK(e.Columns, e.Rows):
		if err := setWinsize(s.pty.ptmx, e.Columns, e.Rows, 0, 0); err != nil {
			s.log.Debug("resize pty", "err", err)
		}
	}
}

// finish is called when the channel is gone: it kills a command that is
// still running and waits until the session's goroutines are done.
func (s *session) finish() {
	if p := s.proc; p != nil {
		// Reaped, not done: the host closes its end once it has the exit
		// record, before done; a command that ended must not take what
		// it left in the background with it.
		select {
		case <-p.reaped:
		default:
			s.log.Info("session closed while the command runs; killing its process group", "pgid", p.pgid)
			_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
		}
		<-p.done
	}
	if s.pty != nil {
		// Unblock an input copier stuck writing to the terminal.
		_ = s.pty.ptmx.SetDeadline(time.Now())
	}
	s.io.Wait()
	if s.pty != nil {
		s.pty.close()
	}
}

func (p *ptyState) close() {
	_ = p.ptmx.Close()
	if p.tty != nil {
		_ = p.tty.Close()
	}
}

// signal delivers a signal to the command's whole process group until the
// command has been reaped (not to what it left in the background).
func (s *session) signal(name string) {
	sig, ok := parseSignal(name)
	if !ok || s.proc == nil {
		s.log.Debug("ignoring signal", "signal", name, "started", s.proc != nil)
		return
	}
	select {
	case <-s.proc.reaped:
		return
	default:
	}
	if err := syscall.Kill(-s.proc.pgid, sig); err != nil {
		s.log.Debug("deliver signal", "signal", name, "err", err)
	}
}

// begin validates the command, allocates its terminal and starts it,
// reporting whether the channel was accepted. A user the guest has no
// account for (or one that is root's in disguise) rejects the channel
// with the reason: the command never was, and the host says so as the
// guest's refusal. Failures to start the command are reported as exit
// codes 126 and 127 with a message, as a shell would.
func (s *session) begin(o agentproto.Open) bool {
	err := validateOpen(o)
	var id identity
	if err == nil {
		id, err = lookupIdentity(o.Spec.User, s.lookup)
	}
	if err == nil && o.PTY != nil {
		err = s.allocatePty(*o.PTY)
	}
	if err != nil {
		s.log.Info("rejecting command", "err", err)
		_ = s.ch.Reject(err.Error())
		if s.pty != nil {
			s.pty.close()
		}
		return false
	}
	if err := s.ch.Accept(); err != nil {
		return false
	}
	spec := o.Spec
	term := ""
	if s.pty != nil {
		term = s.pty.term
	}
	env := buildEnv(id, term, nil, spec.Env)
	dir := workDir(spec.Dir, id.home)
	if err := checkDir(dir); err != nil {
		s.exitEarly(dirFailure(dir, err))
		return true
	}
	path, err := lookPath(spec.Argv[0], envValue(env, "PATH"), dir, id)
	if err != nil {
		s.exitEarly(startFailure(spec.Argv[0], err))
		return true
	}
	cmd := newCommand(path, spec.Argv, env, dir, id, s.pty != nil)
	if err := s.start(cmd); err != nil {
		s.exitEarly(startFailure(spec.Argv[0], err))
		return true
	}
	s.log.Debug("command started", "argv", spec.Argv, "user", id.name, "dir", dir, "pid", cmd.Process.Pid)
	return true
}

// allocatePty opens the terminal the host asked for.
func (s *session) allocatePty(p agentproto.PTY) error {
	ptmx, tty, err := openPty()
	if err != nil {
		return fmt.Errorf("allocate pty: %w", err)
	}
	if err := setWinsize(ptmx, p.Columns, p.Rows, 0, 0); err != nil {
		s.log.Warn("allocate pty", "err", err)
	}
	s.pty = &ptyState{ptmx: ptmx, tty: tty, term: p.Term}
	return nil
}

// exitEarly reports a command that could not be started.
func (s *session) exitEarly(code uint32, msg string) {
	s.log.Info("command not started", "exit_status", code, "reason", strings.TrimSpace(msg))
	_, _ = io.WriteString(s.ch.Stderr(), msg)
	s.report(agentproto.Exit{Status: code})
}

// start starts cmd wired to the channel or to the pty and the goroutines that
// serve it.
func (s *session) start(cmd *exec.Cmd) error {
	if s.pty != nil {
		return s.startPty(cmd)
	}
	cmd.Stdout = s.ch
	cmd.Stderr = s.ch.Stderr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("stdin pipe: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	s.proc = &process{cmd: cmd, pgid: cmd.Process.Pid, reaped: make(chan struct{}), done: make(chan struct{})}
	s.io.Go(func() { copyInput(stdin, s.ch, true) })
	go s.wait(nil)
	return nil
}

// startPty starts cmd on the session's terminal.
func (s *session) startPty(cmd *exec.Cmd) error {
	tty := s.pty.tty
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	if err := cmd.Start(); err != nil {
		return err
	}
	// Only the command keeps the slave side open, so that reading the
	// master ends (EIO) once the command and its children are gone.
	_ = tty.Close()
	s.pty.tty = nil
	s.proc = &process{cmd: cmd, pgid: cmd.Process.Pid, reaped: make(chan struct{}), done: make(chan struct{})}
	ptmx := s.pty.ptmx
	s.io.Go(func() { copyInput(ptmx, s.ch, false) })
	output := make(chan struct{})
	go func() {
		defer close(output)
		_, _ = io.Copy(s.ch, ptmx)
	}()
	go s.wait(output)
	return nil
}

// copyInput copies the channel's data to the command's input. On EOF from
// the host it closes a pipe (closeOnEOF); a terminal stays open. Once the
// command stops accepting input, the rest of the input is discarded so
// that the host is never blocked writing.
func copyInput(w io.WriteCloser, ch *agentconn.Channel, closeOnEOF bool) {
	_, err := io.Copy(w, ch)
	if closeOnEOF {
		_ = w.Close()
	}
	if err != nil {
		_, _ = io.Copy(io.Discard, ch)
	}
}

// wait reaps the command, waits for its output (at most waitDelay past its
// exit when background processes hold the output open) and reports how it
// ended. output, if not nil, is closed when the pty output has been copied.
func (s *session) wait(output <-chan struct{}) {
	p := s.proc
	err := p.cmd.Wait()
	if err != nil && !isExitError(err) {
		s.log.Debug("wait for command", "err", err)
	}
	if output != nil {
		select {
		case <-output:
		case <-time.After(waitDelay):
			_ = s.pty.ptmx.SetReadDeadline(time.Now())
			<-output
		}
	}
	s.log.Debug("command ended", "pid", p.pgid, "state", p.cmd.ProcessState)
	close(p.reaped)
	s.report(exitRecord(p.cmd.ProcessState))
	close(p.done)
}

func isExitError(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

// exitRecord says how a process ended.
func exitRecord(ps *os.ProcessState) agentproto.Exit {
	if ps == nil {
		return agentproto.Exit{Status: 255}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return agentproto.Exit{Signal: signalName(ws.Signal()), CoreDumped: ws.CoreDump()}
	}
	return agentproto.Exit{Status: uint32(ps.ExitCode())}
}

// report sends EOF, then the exit record, then closes the channel. All
// output has been written to the channel before report is called.
func (s *session) report(e agentproto.Exit) {
	_ = s.ch.CloseWrite()
	_ = s.ch.Exit(e)
	_ = s.ch.Close()
}
