package agent

import (
	"errors"
	"fmt"
	"github.com/vmgate/vmgate/internal/sshmsg"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/vm/agentproto"
)

// waitDelay bounds how long a finished command's output is still awaited
// when background processes keep its stdout, stderr or terminal open.
const waitDelay = time.Second

// maxEnvRequests bounds the number of "env" requests per session.
const maxEnvRequests = 4096

// session is one session channel: it collects "env" and "pty-req" requests,
// runs exactly one command and reports how it ended.
type session struct {
	ch  ssh.Channel
	log *slog.Logger

	env     []string // from "env" requests, as KEY=VALUE
	pty     *ptyState
	started bool     // a command request was accepted
	proc    *process // the started command, nil if none was started

	io sync.WaitGroup // goroutines copying input to the command
}

// ptyState is the pseudo-terminal requested by "pty-req".
type ptyState struct {
	ptmx *os.File // master side, used by the agent
	tty  *os.File // slave side until the command has been started
	term string
}

// process is a started command.
type process struct {
	cmd  *exec.Cmd
	pgid int
	// done is closed once the command has been reaped and its end reported
	// to the host.
	done chan struct{}
}

// serveSession runs a session until its channel is closed by the host or the
// connection is lost. If its command is still running then, the command's
// process group is killed. It returns once the command has been reaped and
// every goroutine of the session has finished.
func serveSession(log *slog.Logger, ch ssh.Channel, reqs <-chan *ssh.Request) {
	s := &session{ch: ch, log: log}
	for req := range reqs {
		s.handle(req)
	}
	s.finish()
}

// handle dispatches one channel request.
func (s *session) handle(req *ssh.Request) {
	switch req.Type {
	case "env":
		reply(req, s.setEnv(req.Payload))
	case "pty-req":
		reply(req, s.allocatePty(req.Payload))
	case "window-change":
		reply(req, s.resizePty(req.Payload))
	case "signal":
		// The reply goes out before the signal: a command that dies of it
		// ends the channel, and a reply after that would be lost.
		deliver := s.signal(req.Payload)
		reply(req, deliver != nil)
		if deliver != nil {
			deliver()
		}
	case agentproto.ExecRequest:
		s.execSpec(req)
	case "exec":
		s.execShellCommand(req)
	case "shell":
		s.execLoginShell(req)
	default:
		s.log.Debug("rejecting session request", "type", req.Type)
		reply(req, false)
	}
}

func reply(req *ssh.Request, ok bool) {
	_ = req.Reply(ok, nil)
}

// finish is called when the channel is gone: it kills a command that is
// still running and waits until the session's goroutines are done.
func (s *session) finish() {
	if p := s.proc; p != nil {
		select {
		case <-p.done:
		default:
			s.log.Info("session closed while the command runs; killing its process group", "pgid", p.pgid)
			_ = syscall.Kill(-p.pgid, syscall.SIGKILL)
			<-p.done
		}
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

// setEnv handles an "env" request.
func (s *session) setEnv(payload []byte) bool {
	var r sshmsg.EnvRequest
	if s.started || ssh.Unmarshal(payload, &r) != nil || len(s.env) >= maxEnvRequests {
		return false
	}
	if err := validateEnvVar(r.Name, r.Value); err != nil {
		s.log.Debug("rejecting env request", "err", err)
		return false
	}
	s.env = append(s.env, r.Name+"="+r.Value)
	return true
}

// allocatePty handles a "pty-req" request.
func (s *session) allocatePty(payload []byte) bool {
	var r sshmsg.PtyRequest
	if s.started || s.pty != nil || ssh.Unmarshal(payload, &r) != nil || !sshmsg.TermSizeOK(r.Columns, r.Rows) || !sshmsg.TermNameOK(r.Term) {
		return false
	}
	if err := validateEnvVar("TERM", r.Term); err != nil {
		return false
	}
	ptmx, tty, err := openPty()
	if err != nil {
		s.log.Warn("allocate pty", "err", err)
		return false
	}
	if err := setWinsize(ptmx, r.Columns, r.Rows, r.Width, r.Height); err != nil {
		s.log.Warn("allocate pty", "err", err)
	}
	s.pty = &ptyState{ptmx: ptmx, tty: tty, term: r.Term}
	return true
}

// resizePty handles a "window-change" request.
func (s *session) resizePty(payload []byte) bool {
	var r sshmsg.WindowChangeRequest
	if s.pty == nil || ssh.Unmarshal(payload, &r) != nil || !sshmsg.TermSizeOK(r.Columns, r.Rows) {
		return false
	}
	return setWinsize(s.pty.ptmx, r.Columns, r.Rows, r.Width, r.Height) == nil
}

// signal handles a "signal" request: the signal goes to the command's whole
// process group until the command's end has been reported.
// signal checks a signal request and returns the function that delivers
// it to the command's process group, or nil to refuse it.
func (s *session) signal(payload []byte) func() {
	var r sshmsg.SignalRequest
	if s.proc == nil || ssh.Unmarshal(payload, &r) != nil {
		return nil
	}
	sig, ok := parseSignal(r.Signal)
	if !ok {
		s.log.Debug("rejecting unknown signal", "signal", r.Signal)
		return nil
	}
	select {
	case <-s.proc.done:
		return nil
	default:
	}
	pgid := s.proc.pgid
	return func() {
		if err := syscall.Kill(-pgid, sig); err != nil {
			s.log.Debug("deliver signal", "signal", r.Signal, "err", err)
		}
	}
}

// execSpec handles an agentproto.ExecRequest.
func (s *session) execSpec(req *ssh.Request) {
	if s.started {
		s.reject(req, errors.New("a command was already started in this session"))
		return
	}
	var p agentproto.ExecPayload
	if err := ssh.Unmarshal(req.Payload, &p); err != nil {
		s.reject(req, fmt.Errorf("decode exec payload: %w", err))
		return
	}
	spec, err := decodeExecSpec([]byte(p.JSON))
	if err != nil {
		s.reject(req, err)
		return
	}
	s.run(req, spec)
}

// execShellCommand handles an RFC 4254 "exec" request with /bin/sh -c.
func (s *session) execShellCommand(req *ssh.Request) {
	if s.started {
		s.reject(req, errors.New("a command was already started in this session"))
		return
	}
	var r sshmsg.ExecRequest
	if err := ssh.Unmarshal(req.Payload, &r); err != nil {
		s.reject(req, fmt.Errorf("decode exec request: %w", err))
		return
	}
	if hasNUL(r.Command) {
		s.reject(req, errors.New("command contains a NUL byte"))
		return
	}
	s.run(req, agentproto.ExecSpec{Argv: []string{"/bin/sh", "-c", r.Command}})
}

// execLoginShell handles a "shell" request, which is only accepted on a
// terminal: it runs root's login shell.
func (s *session) execLoginShell(req *ssh.Request) {
	if s.started || s.pty == nil {
		s.reject(req, errors.New("a shell needs a pty and a session without a command"))
		return
	}
	s.run(req, agentproto.ExecSpec{Argv: []string{rootIdentity().shell, "-l"}})
}

// reject answers a command request negatively, with the reason on stderr.
func (s *session) reject(req *ssh.Request, err error) {
	s.log.Info("rejecting command request", "type", req.Type, "err", err)
	_, _ = fmt.Fprintf(s.ch.Stderr(), "vmgate-agent: %v\n", err)
	reply(req, false)
}

// run accepts req and runs spec, which has been validated. Failures to start
// the command are reported as exit codes 126 and 127 with a message.
func (s *session) run(req *ssh.Request, spec agentproto.ExecSpec) {
	id, err := lookupIdentity(spec.User)
	if err != nil {
		s.reject(req, err)
		return
	}
	s.started = true
	reply(req, true)

	term := ""
	if s.pty != nil {
		term = s.pty.term
	}
	env := buildEnv(id, term, s.env, spec.Env)
	dir := workDir(spec.Dir, id.home)
	if err := checkDir(dir); err != nil {
		s.exitEarly(dirFailure(dir, err))
		return
	}
	path, err := lookPath(spec.Argv[0], envValue(env, "PATH"), dir, id)
	if err != nil {
		s.exitEarly(startFailure(spec.Argv[0], err))
		return
	}
	cmd := newCommand(path, spec.Argv, env, dir, id, s.pty != nil)
	if err := s.start(cmd); err != nil {
		s.exitEarly(startFailure(spec.Argv[0], err))
		return
	}
	s.log.Debug("command started", "argv", spec.Argv, "user", id.name, "dir", dir, "pid", cmd.Process.Pid)
}

// exitEarly reports a command that could not be started.
func (s *session) exitEarly(code uint32, msg string) {
	s.log.Info("command not started", "exit_status", code, "reason", strings.TrimSpace(msg))
	_, _ = io.WriteString(s.ch.Stderr(), msg)
	s.report(&sshmsg.ExitStatusMsg{Status: code}, nil)
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
	s.proc = &process{cmd: cmd, pgid: cmd.Process.Pid, done: make(chan struct{})}
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
	s.proc = &process{cmd: cmd, pgid: cmd.Process.Pid, done: make(chan struct{})}
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
func copyInput(w io.WriteCloser, ch ssh.Channel, closeOnEOF bool) {
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
	status, sig := exitMessage(p.cmd.ProcessState)
	s.log.Debug("command ended", "pid", p.pgid, "state", p.cmd.ProcessState)
	s.report(status, sig)
	close(p.done)
}

func isExitError(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee)
}

// exitMessage converts how a process ended into an "exit-status" or an
// "exit-signal" message; exactly one of the results is non-nil.
func exitMessage(ps *os.ProcessState) (*sshmsg.ExitStatusMsg, *sshmsg.ExitSignalMsg) {
	if ps == nil {
		return &sshmsg.ExitStatusMsg{Status: 255}, nil
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return nil, &sshmsg.ExitSignalMsg{Signal: signalName(ws.Signal()), CoreDumped: ws.CoreDump()}
	}
	return &sshmsg.ExitStatusMsg{Status: uint32(ps.ExitCode())}, nil
}

// report sends EOF, then the exit message, then closes the channel. All
// output has been written to the channel before report is called.
func (s *session) report(status *sshmsg.ExitStatusMsg, sig *sshmsg.ExitSignalMsg) {
	_ = s.ch.CloseWrite()
	if sig != nil {
		_, _ = s.ch.SendRequest("exit-signal", false, ssh.Marshal(sig))
	} else {
		_, _ = s.ch.SendRequest("exit-status", false, ssh.Marshal(status))
	}
	_ = s.ch.Close()
}
