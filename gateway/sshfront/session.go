package sshfront

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/tty"
	"github.com/vmgate/vmgate/policy"
)

// jobSpec is what a session channel asked for once it sends "exec" or
// "shell".
// login is what a connection's login name selects: a session, or an
// error for a session name that is not one.
type login struct {
	session string
	err     error
}

type jobSpec struct {
	command     string // for exec
	interactive bool   // shell
	env         []string
	tty         *wire.TTY
}

// serveChannel serves one session channel: a session collects env and
// pty-req requests, then the exec or shell request starts the command
// through Core.Exec (run), whose outcome is reported as exit-status or
// exit-signal. The command is killed (and its VM
// destroyed) when the channel or connection closes. release gives the
// session's slot back (connState); run calls it before it reports the
// outcome.
func (f *Front) serveChannel(log *slog.Logger, id policy.Identity, lg login, noPTY bool, nc ssh.NewChannel, release func()) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	ss := &session{f: f, log: log, id: id, noPTY: noPTY, envSeen: map[string]bool{},
		startc: make(chan jobSpec, 1), signals: make(chan string, 8), resize: make(chan wire.TTY, 1)}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for r := range reqs {
			ss.handle(r)
		}
	}()
	select {
	case job := <-ss.startc:
		f.run(log, id, lg, ch, job, ss.signals, ss.resize, gone, release)
	case <-gone:
	case <-time.After(f.cfg.HandshakeTimeout):
		log.Info("ssh session asked for no command or shell in time, closing it", "timeout", f.cfg.HandshakeTimeout)
	}
}

// session is one session channel's requests, in the order RFC 4254
// gives them (as the guest agent's session takes them): env, pty-req and
// window-change set the command up; exec or shell starts it; then signal
// and window-change reach the running command. Requests arrive on one
// goroutine; what reaches the command goes through channels.
type session struct {
	f     *Front
	log   *slog.Logger
	id    policy.Identity
	noPTY bool // the key's no-pty option

	job     jobSpec
	envSeen map[string]bool
	started bool

	startc  chan jobSpec  // the job, once
	signals chan string   // RFC 4254 signal names for the command
	resize  chan wire.TTY // the latest terminal size for the command
}

// handle answers one channel request.
func (ss *session) handle(r *ssh.Request) {
	ok := false
	switch r.Type {
	case reqEnv:
		ok = ss.env(r.Payload)
	case reqPtyReq:
		ok = ss.pty(r.Payload)
	case reqWindowChange:
		ok = ss.windowChange(r.Payload)
	case reqExec, reqShell:
		if ss.start(r) {
			return // replied already
		}
	case reqSignal:
		ok = ss.signal(r.Payload)
	}
	if r.WantReply {
		_ = r.Reply(ok, nil)
	}
}

// env passes a variable the profile allows, before the command starts.
func (ss *session) env(payload []byte) bool {
	var p envRequest
	switch {
	case ss.started || ssh.Unmarshal(payload, &p) != nil:
		return false
	case ss.envSeen[p.Name] || len(ss.job.env) >= policy.MaxEnv || len(p.Name)+len(p.Value) >= policy.MaxArgBytes ||
		strings.ContainsRune(p.Name+p.Value, 0):
		return false
	case !ss.f.core.Policy().AllowsEnv(ss.id, p.Name):
		ss.log.Debug("ssh env variable not passed: the profile does not allow it", "name", truncate(p.Name, 64))
		return false
	}
	ss.envSeen[p.Name] = true
	ss.job.env = append(ss.job.env, p.Name+"="+p.Value)
	return true
}

// pty asks for a terminal, before the command starts, unless the key
// forbids it.
func (ss *session) pty(payload []byte) bool {
	var p ptyRequest
	if ss.started || ss.noPTY || ssh.Unmarshal(payload, &p) != nil || !tty.SizeOK(p.Columns, p.Rows) || !tty.NameOK(p.Term) {
		return false
	}
	ss.job.tty = &wire.TTY{Term: p.Term, Cols: p.Columns, Rows: p.Rows}
	return true
}

// windowChange sets the terminal's size: before the command starts, the
// pty's; after, the latest size goes to the running command (a size not
// yet taken is replaced).
func (ss *session) windowChange(payload []byte) bool {
	var p windowChangeRequest
	if ss.job.tty == nil || ssh.Unmarshal(payload, &p) != nil || p.Columns == 0 || p.Rows == 0 || !tty.SizeOK(p.Columns, p.Rows) {
		return false
	}
	if !ss.started {
		ss.job.tty.Cols, ss.job.tty.Rows = p.Columns, p.Rows
		return true
	}
	sz := wire.TTY{Cols: p.Columns, Rows: p.Rows}
	select {
	case ss.resize <- sz:
	default:
		select {
		case <-ss.resize:
		default:
		}
		select {
		case ss.resize <- sz:
		default:
		}
	}
	return true
}

// start takes the exec or shell request: the first one starts the job,
// replied to before the command can send anything. It reports whether it
// replied.
func (ss *session) start(r *ssh.Request) bool {
	if ss.started {
		return false
	}
	if r.Type == reqExec {
		var p execRequest
		if ssh.Unmarshal(r.Payload, &p) != nil {
			return false
		}
		ss.job.command = p.Command
	} else {
		ss.job.interactive = true
	}
	ss.started = true
	if r.WantReply {
		_ = r.Reply(true, nil)
	}
	ss.startc <- ss.job
	return true
}

// signal passes a signal to the running command (dropped when 8 wait).
func (ss *session) signal(payload []byte) bool {
	var p signalRequest
	if !ss.started || ssh.Unmarshal(payload, &p) != nil {
		return false
	}
	select {
	case ss.signals <- strings.TrimPrefix(p.Signal, "SIG"):
		return true
	default:
		return false
	}
}

// run runs a session channel's command or shell and reports its outcome.
// It calls release once the output is written, before the EOF and the
// exit status tell the client that the command ended.
func (f *Front) run(log *slog.Logger, id policy.Identity, lg login, ch ssh.Channel, job jobSpec, signals chan string, resize chan wire.TTY, gone <-chan struct{}, release func()) {
	req := &wire.ExecRequest{Env: job.env, Stdin: true, TTY: job.tty, Session: lg.session}
	if job.interactive {
		req.Argv = append([]string(nil), f.cfg.InteractiveShell...)
	} else {
		req.Argv, req.Shell = []string{job.command}, true
	}
	nl := "\n"
	if job.tty != nil {
		nl = "\r\n" // the client's terminal is in raw mode
	}
	// report ends the session: the slot first, then what tells the client.
	report := func(req string, msg any) {
		release()
		_ = ch.CloseWrite()
		_, _ = ch.SendRequest(req, false, ssh.Marshal(msg))
	}
	fail := func(code int, msg string) {
		_, _ = io.WriteString(ch.Stderr(), "vmgate: "+msg+nl)
		report(reqExitStatus, exitStatusMsg{Status: uint32(code)})
	}
	if strings.ContainsRune(job.command, 0) {
		fail(wire.ExitDenied, "the command contains a NUL byte")
		return
	}
	r := Request{ID: id, Exec: req, Interactive: job.interactive, Stdin: ch, Stdout: ch, Stderr: ch.Stderr(),
		Signals: signals, Resize: resize, Gone: gone, Refused: lg.err}
	// An interactive shell ends after the profile's idle time without
	// traffic, counted from admission.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var idled atomic.Bool
	var idle time.Duration
	if job.interactive {
		a := &activity{}
		a.touch()
		r.Stdin = &activityReader{r: ch, a: a}
		r.Stdout = &activityWriter{w: ch, a: a}
		r.Stderr = &activityWriter{w: ch.Stderr(), a: a}
		r.Admitted = func(l policy.Limits) {
			idle = l.SessionIdle
			a.touch()
			go a.watch(ctx, idle, func() {
				idled.Store(true)
				log.Info("interactive shell idle, ending it", "idle", idle)
				cancel()
			})
		}
	}
	o := f.core.Exec(ctx, log, r)
	switch {
	case o.Refused != nil:
		code, msg := refusal(*o.Refused)
		fail(code, msg)
	case idled.Load():
		fail(wire.ExitTimedOut, fmt.Sprintf("no input or output for %v (the profile's sessions.idle_timeout); the shell was ended", idle))
	case o.Err != nil:
		select {
		case <-gone:
			return // nobody to tell
		default:
		}
		if o.Stopping {
			fail(wire.ExitVMFailed, fmt.Sprintf("the command was killed: vmgated stopped and its grace period ended (request %s)", o.RequestID))
			return
		}
		fail(wire.ExitVMFailed, fmt.Sprintf("the command's outcome is unknown: %v (request %s)", o.Err, o.RequestID))
	case o.Result.TimedOut:
		fail(o.Result.ExitStatus(), fmt.Sprintf("timed out after %v; the command was killed (request %s)", o.Limits.Timeout, o.RequestID))
	default:
		res := o.Result
		if res.StdoutTruncated || res.StderrTruncated {
			_, _ = fmt.Fprintf(ch.Stderr(), "vmgate: output truncated by the policy's output limit (stdout %d bytes, stderr %d bytes produced)%s", res.StdoutBytes, res.StderrBytes, nl)
		}
		if res.Signal != "" {
			report(reqExitSignal, exitSignalMsg{Signal: res.Signal})
		} else {
			report(reqExitStatus, exitStatusMsg{Status: uint32(res.ExitCode)})
		}
	}
}

// refusal maps a refusal to the message an SSH client gets on stderr
// and the exit status, with vm-exec's codes (wire.Error.ExitCode).
func refusal(e wire.Error) (int, string) {
	msg := e.Message()
	if e.RequestID != "" {
		msg += " (request " + e.RequestID + ")"
	}
	return e.ExitCode(), msg
}

// activity is the time of the last traffic of an interactive shell.
type activity struct{ last atomic.Int64 }

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// watch calls idle once when there was no traffic for d; it returns when
// ctx ends.
func (a *activity) watch(ctx context.Context, d time.Duration, idle func()) {
	if d <= 0 {
		return
	}
	t := time.NewTicker(min(d/4, 5*time.Second) + time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if now.Sub(time.Unix(0, a.last.Load())) >= d {
				idle()
				return
			}
		}
	}
}

type activityReader struct {
	r io.Reader
	a *activity
}

func (r *activityReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.a.touch()
	}
	return n, err
}

type activityWriter struct {
	w io.Writer
	a *activity
}

func (w *activityWriter) Write(p []byte) (int, error) {
	w.a.touch()
	return w.w.Write(p)
}
