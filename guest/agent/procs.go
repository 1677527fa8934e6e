package agent

import (
	"context"
	"encoding"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/procstat"
)

// Background processes (agentproto's proc calls). The table is the
// agent's, not a connection's: a process started on one host connection
// runs on after it ends, and the next connection finds it by its handle.
// A command on a channel (session.go) still dies with its channel.
//
// Reaping: a background process is the agent's own child, reaped by its
// exec.Cmd's Wait like a command, so its exit status is the agent's to
// read. The agent never runs as PID 1: in an imported root PID 1 is the
// binary's init (package boot), which reaps orphans with wait4(-1) but
// has only the agent daemon and orphans as children, never the agent's
// own children.
//
// Lock order: procTable.mu, then bgProc.mu, then inputQueue.mu.

// Bounds of the table that the protocol leaves to the agent.
const (
	// keepEndedFactor: the table keeps at most this many times the
	// latest start's MaxProcs ended processes (their output readable),
	// and forgets the oldest past that.
	keepEndedFactor = 2
	// listBudget bounds the encoded processes of one ProcList reply,
	// within agentproto.MaxGuestPayload.
	listBudget = 48 << 10
	// inputWait is how long a ProcInput waits for a process to read the
	// input already queued before it is refused (ProcErrBusy): well
	// within the host's limit of a call.
	inputWait = 5 * time.Second
)

// procTable is the agent's table of background processes.
type procTable struct {
	log *slog.Logger

	mu        sync.Mutex
	procs     []*bgProc // handle order
	byHandle  map[int64]*bgProc
	last      int64 // the last handle given
	running   int   // processes started and not ended, reserved starts included
	keepEnded int
	closed    bool
}

// newProcTable returns an empty table; a nil log means slog.Default().
func newProcTable(log *slog.Logger) *procTable {
	if log == nil {
		log = slog.Default()
	}
	return &procTable{log: log, byHandle: map[int64]*bgProc{}, keepEnded: keepEndedFactor * agentproto.MaxProcs}
}

// bgProc is one background process.
type bgProc struct {
	handle  int64
	argv    []string // cut to MaxInfoArgv
	argvCut bool
	user    string
	dir     string
	started time.Time
	cmd     *exec.Cmd // nil when it could not be started
	pid     int
	stdin   *inputQueue // nil without an input pipe
	// done is closed when the process is reaped (no signal may reach
	// its pid after it); entered once its end is in the table (end).
	done, entered chan struct{}

	mu       sync.Mutex
	out      *procOutput
	ended    time.Time // zero while it runs
	exit     agentproto.Exit
	timedOut bool
	changed  chan struct{} // closed, and replaced, at each change
}

// procErr is a refusal of a proc call with its code.
func procErr(code, format string, args ...any) error {
	return fmt.Errorf("%s: "+format, append([]any{code}, args...)...)
}

// notify wakes the readers waiting for a change. Called with p.mu held.
func (p *bgProc) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// info is the process as the table has it. Called with p.mu held.
func (p *bgProc) info() agentproto.ProcInfo {
	o := p.out
	pi := agentproto.ProcInfo{
		Handle: p.handle, PID: p.pid, Argv: p.argv, ArgvCut: p.argvCut, User: p.user, Dir: p.dir,
		State: agentproto.ProcRunning, Started: p.started.UnixNano(),
		Out: o.streams[0].total, Err: o.streams[1].total,
		OutDropped: o.streams[0].dropped(), ErrDropped: o.streams[1].dropped(),
		Next: o.next, StdinOpen: p.stdin != nil && p.stdin.open(),
	}
	if !p.ended.IsZero() {
		e := p.exit
		pi.State, pi.Exit, pi.TimedOut, pi.Ended = agentproto.ProcExited, &e, p.timedOut, p.ended.UnixNano()
	}
	return pi
}

// streamWriter writes one stream of a process into its output.
type streamWriter struct {
	p      *bgProc
	stream int
}

func (w streamWriter) Write(b []byte) (int, error) {
	w.p.mu.Lock()
	w.p.out.write(w.stream, b)
	w.p.notify()
	w.p.mu.Unlock()
	return len(b), nil
}

// checkProcStart validates a start's bounds (validateExecSpec checks its
// command) and returns its buffer size and process limit.
func checkProcStart(req agentproto.ProcStart) (buffer, limit int, err error) {
	if err := validateExecSpec(req.Spec); err != nil {
		return 0, 0, err
	}
	switch {
	case len(req.Spec.Dir) > agentproto.MaxProcDir:
		return 0, 0, fmt.Errorf("dir of %d bytes, at most %d", len(req.Spec.Dir), agentproto.MaxProcDir)
	case req.TimeoutMS < 0:
		return 0, 0, fmt.Errorf("timeout of %d ms", req.TimeoutMS)
	case req.BufferBytes < 0 || req.BufferBytes > agentproto.MaxProcBuffer:
		return 0, 0, fmt.Errorf("buffer of %d bytes, at most %d", req.BufferBytes, agentproto.MaxProcBuffer)
	case req.MaxProcs < 0:
		return 0, 0, fmt.Errorf("max procs %d", req.MaxProcs)
	}
	buffer = int(req.BufferBytes)
	if buffer == 0 {
		buffer = agentproto.DefaultProcBuffer
	}
	limit = agentproto.MaxProcs
	if req.MaxProcs > 0 {
		limit = min(req.MaxProcs, agentproto.MaxProcs)
	}
	return buffer, limit, nil
}

// start starts a background process: it reserves a place among the
// running ones (or refuses, ProcErrLimit), starts it outside the table's
// lock and enters it. A process that cannot be started is entered as
// ended, with its exit status and message, as a command reports them.
// lookup is the account database (nil: user.Lookup).
func (t *procTable) start(req agentproto.ProcStart, lookup lookupUserFunc) (agentproto.ProcInfo, error) {
	buffer, limit, err := checkProcStart(req)
	if err != nil {
		return agentproto.ProcInfo{}, procErr(agentproto.ProcErrInvalid, "%v", err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return agentproto.ProcInfo{}, procErr(agentproto.ProcErrLimit, "the agent is stopping")
	}
	if t.running >= limit {
		n := t.running
		t.mu.Unlock()
		return agentproto.ProcInfo{}, procErr(agentproto.ProcErrLimit, "%d processes run, at most %d", n, limit)
	}
	t.running++
	t.last++
	t.keepEnded = keepEndedFactor * limit
	p := &bgProc{handle: t.last, started: time.Now(), done: make(chan struct{}), entered: make(chan struct{}), out: newProcOutput(buffer), changed: make(chan struct{})}
	t.mu.Unlock()

	p.argv, p.argvCut = cutArgv(req.Spec.Argv, agentproto.MaxInfoArgv)
	p.user = req.Spec.User
	if p.user == "" {
		p.user = "root"
	}
	code, msg := p.launch(req, lookup)
	t.mu.Lock()
	t.procs = append(t.procs, p)
	t.byHandle[p.handle] = p
	t.mu.Unlock()
	if msg != "" {
		t.log.Debug("background process not started", "handle", p.handle, "exit_status", code, "reason", msg)
		_, _ = streamWriter{p, agentproto.StreamStderr}.Write([]byte(msg))
		close(p.done)
		t.end(p, agentproto.Exit{Status: code}, false)
	} else {
		t.log.Debug("background process started", "handle", p.handle, "pid", p.pid, "argv", p.argv, "user", p.user, "dir", p.dir)
		go t.wait(p, time.Duration(req.TimeoutMS)*time.Millisecond)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info(), nil
}

// launch resolves the process's user, directory and program as a
// command's (session.begin) and starts it in a session of its own. When
// it cannot, it returns the exit status and the message a command would
// end with.
func (p *bgProc) launch(req agentproto.ProcStart, lookup lookupUserFunc) (code uint32, msg string) {
	spec := req.Spec
	id, err := lookupIdentity(spec.User, lookup)
	if err != nil {
		return userFailure(err)
	}
	p.user = id.name
	env := buildEnv(id, "", nil, spec.Env)
	p.dir = workDir(spec.Dir, id.home)
	if err := checkDir(p.dir); err != nil {
		return dirFailure(p.dir, err)
	}
	path, err := lookPath(spec.Argv[0], envValue(env, "PATH"), p.dir, id)
	if err != nil {
		return startFailure(spec.Argv[0], err)
	}
	cmd := newCommand(path, spec.Argv, env, p.dir, id, false)
	// A session of its own (and so a process group): no terminal, and
	// the agent's signals and the timeout reach all of it.
	cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Setsid = false, true
	cmd.Stdout = streamWriter{p, agentproto.StreamStdout}
	cmd.Stderr = streamWriter{p, agentproto.StreamStderr}
	var stdin *os.File
	if req.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return startFailure(spec.Argv[0], fmt.Errorf("stdin pipe: %w", err))
		}
		cmd.Stdin, stdin = r, w
		defer r.Close() // the child has its own copy
	}
	if err := cmd.Start(); err != nil {
		if stdin != nil {
			_ = stdin.Close()
		}
		return startFailure(spec.Argv[0], err)
	}
	p.cmd, p.pid = cmd, cmd.Process.Pid
	if stdin != nil {
		p.stdin = newInputQueue(stdin)
	}
	return 0, ""
}

// wait reaps the process (its output copied, or given up waitDelay after
// it exited while others hold its pipes), ends it at its timeout, and
// enters how it ended.
func (t *procTable) wait(p *bgProc, timeout time.Duration) {
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, func() {
			select {
			case <-p.done:
				return
			default:
			}
			t.log.Info("background process timed out; killing its session", "handle", p.handle, "pid", p.pid, "timeout", timeout)
			p.mu.Lock()
			p.timedOut = true
			p.mu.Unlock()
			killSession(p.pid)
		})
	}
	err := p.cmd.Wait()
	if err != nil && !isExitError(err) {
		t.log.Debug("wait for background process", "handle", p.handle, "err", err)
	}
	if timer != nil {
		timer.Stop()
	}
	if p.stdin != nil {
		p.stdin.close()
	}
	close(p.done)
	p.mu.Lock()
	timedOut := p.timedOut
	p.mu.Unlock()
	t.end(p, exitRecord(p.cmd.ProcessState), timedOut)
}

// end enters the end of p, wakes its readers, and forgets the oldest
// ended processes past the table's bound.
func (t *procTable) end(p *bgProc, e agentproto.Exit, timedOut bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p.mu.Lock()
	p.exit, p.timedOut, p.ended = e, timedOut, time.Now()
	p.notify()
	p.mu.Unlock()
	t.running--
	t.log.Debug("background process ended", "handle", p.handle, "exit", e, "timed_out", timedOut)
	t.forget()
	close(p.entered)
}

// forget drops the oldest ended processes past keepEnded. Called with
// t.mu held.
func (t *procTable) forget() {
	ended := len(t.procs) - t.running
	if ended <= t.keepEnded {
		return
	}
	kept := t.procs[:0]
	for _, p := range t.procs {
		if ended > t.keepEnded && p.isEnded() {
			delete(t.byHandle, p.handle)
			ended--
			continue
		}
		kept = append(kept, p)
	}
	clear(t.procs[len(kept):])
	t.procs = kept
}

func (p *bgProc) isEnded() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.ended.IsZero()
}

// get returns the process of handle, or ProcErrNoHandle.
func (t *procTable) get(handle int64) (*bgProc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.byHandle[handle]
	if p == nil {
		return nil, procErr(agentproto.ProcErrNoHandle, "no process has handle %d", handle)
	}
	return p, nil
}

// list returns the processes after a handle, oldest first, as many as
// listBudget holds (at least one).
func (t *procTable) list(q agentproto.ProcListQuery) agentproto.ProcList {
	t.mu.Lock()
	procs := make([]*bgProc, 0, len(t.procs))
	for _, p := range t.procs {
		if p.handle > q.After {
			procs = append(procs, p)
		}
	}
	t.mu.Unlock()
	var l agentproto.ProcList
	size := 0
	for _, p := range procs {
		p.mu.Lock()
		pi := p.info()
		p.mu.Unlock()
		b, _ := pi.MarshalBinary()
		if size += len(b); size > listBudget && len(l.Procs) > 0 {
			l.More = true
			break
		}
		l.Procs = append(l.Procs, pi)
	}
	return l
}

// logs answers a ProcLogs: the output from Since on, once there is some
// past it or the process has ended, or WaitMS has passed; ctx ends with
// the host's connection.
func (t *procTable) logs(ctx context.Context, req agentproto.ProcLogs) (agentproto.ProcOutput, error) {
	if req.Since < 0 || req.Max < 0 || req.WaitMS < 0 {
		return agentproto.ProcOutput{}, procErr(agentproto.ProcErrInvalid, "since %d, max %d, wait %d ms", req.Since, req.Max, req.WaitMS)
	}
	p, err := t.get(req.Handle)
	if err != nil {
		return agentproto.ProcOutput{}, err
	}
	maxBytes := min(req.Max, agentproto.MaxLogsChunk)
	wait := time.Duration(min(req.WaitMS, agentproto.MaxLogsWait)) * time.Millisecond
	var timeout <-chan time.Time
	if wait > 0 {
		tm := time.NewTimer(wait)
		defer tm.Stop()
		timeout = tm.C
	}
	for {
		p.mu.Lock()
		if req.Since > p.out.next {
			next := p.out.next
			p.mu.Unlock()
			return agentproto.ProcOutput{}, procErr(agentproto.ProcErrInvalid, "offset %d is past the output's end, %d", req.Since, next)
		}
		ready := !p.ended.IsZero() || (maxBytes > 0 && p.out.next > req.Since)
		if ready || timeout == nil {
			out := agentproto.ProcOutput{Info: p.info()}
			out.Chunks, out.Next, out.Dropped, err = p.out.read(req.Since, maxBytes, agentproto.MaxLogsChunks)
			p.mu.Unlock()
			if err != nil {
				return agentproto.ProcOutput{}, procErr(agentproto.ProcErrInvalid, "%v", err)
			}
			return out, nil
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-timeout:
			timeout = nil // answer with what there is
		case <-ctx.Done():
			return agentproto.ProcOutput{}, ctx.Err()
		}
	}
}

// input queues a ProcInput's data for the process and, with EOF, closes
// its input after it.
func (t *procTable) input(req agentproto.ProcInput) error {
	if len(req.Data) > agentproto.MaxInputChunk {
		return procErr(agentproto.ProcErrInvalid, "%d bytes of input, at most %d", len(req.Data), agentproto.MaxInputChunk)
	}
	p, err := t.get(req.Handle)
	if err != nil {
		return err
	}
	if p.stdin == nil {
		return procErr(agentproto.ProcErrEnded, "process %d was started without an input", req.Handle)
	}
	return p.stdin.put(req.Data, req.EOF, inputWait)
}

// signal sends a signal to the process's process group.
func (t *procTable) signal(req agentproto.ProcSignal) error {
	sig, ok := parseSignal(req.Signal)
	if !ok {
		return procErr(agentproto.ProcErrInvalid, "unknown signal %q", req.Signal)
	}
	p, err := t.get(req.Handle)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
		return procErr(agentproto.ProcErrEnded, "process %d has ended", req.Handle)
	default:
	}
	if err := syscall.Kill(-p.pid, sig); err != nil {
		return fmt.Errorf("signal process %d: %w", req.Handle, err)
	}
	return nil
}

// close kills every running process's session and waits, at most
// closeWait, until they have been reaped; the table takes no more.
func (t *procTable) close(closeWait time.Duration) {
	t.mu.Lock()
	t.closed = true
	var running []*bgProc
	for _, p := range t.procs {
		if p.cmd != nil && !p.isEnded() {
			running = append(running, p)
		}
	}
	t.mu.Unlock()
	deadline := time.After(closeWait)
	for _, p := range running {
		killSession(p.pid)
	}
	// Each one's end is waited for until it is entered (and logged),
	// not only reaped: nothing of the table runs after close returns.
	for _, p := range running {
		select {
		case <-p.entered:
		case <-deadline:
			return
		}
	}
}

// cutArgv is argv within max bytes, each string counted with four bytes
// more (its encoding), and whether it had to be cut.
func cutArgv(argv []string, max int) ([]string, bool) {
	var out []string
	left := max
	for _, a := range argv {
		if left < 4+len(a) {
			if left > 4 {
				out = append(out, a[:left-4])
			}
			return out, true
		}
		out = append(out, a)
		left -= 4 + len(a)
	}
	return out, false
}

// procDir is where killSession finds the guest's processes.
const procDir = "/proc"

// killSession kills, with SIGKILL, the process group sid and every other
// process of the session sid (a background process is its session's
// leader: its children that made process groups of their own are still
// of its session). A process that left the session (setsid) escapes it,
// as it would escape a terminal's hangup.
func killSession(sid int) {
	_ = syscall.Kill(-sid, syscall.SIGKILL)
	entries, err := os.ReadDir(procDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == sid {
			continue
		}
		if s, ok := sessionOf(pid); ok && s == sid {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// sessionOf reads the session id of pid from /proc/PID/stat.
func sessionOf(pid int) (int, bool) {
	b, err := os.ReadFile(procDir + "/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The fields after the command name: state, ppid, pgrp, session, …
	f, ok := procstat.Fields(string(b))
	if !ok || len(f) < 4 {
		return 0, false
	}
	s, err := strconv.Atoi(f[3])
	return s, err == nil
}

// procCall answers a proc call: it decodes the argument (a payload it
// cannot decode is ProcErrInvalid) and hands it to the table.
func (s *server) procCall(ctx context.Context, op string, args []byte) (encoding.BinaryMarshaler, error) {
	t := s.cfg.procs
	decode := func(m encoding.BinaryUnmarshaler) error {
		if err := m.UnmarshalBinary(args); err != nil {
			return procErr(agentproto.ProcErrInvalid, "%v", err)
		}
		return nil
	}
	switch op {
	case agentproto.CallProcStart:
		var req agentproto.ProcStart
		if err := decode(&req); err != nil {
			return nil, err
		}
		pi, err := t.start(req, s.cfg.lookupUser)
		if err != nil {
			return nil, err
		}
		return pi, nil
	case agentproto.CallProcList:
		var q agentproto.ProcListQuery
		if err := decode(&q); err != nil {
			return nil, err
		}
		return t.list(q), nil
	case agentproto.CallProcLogs:
		var req agentproto.ProcLogs
		if err := decode(&req); err != nil {
			return nil, err
		}
		out, err := t.logs(ctx, req)
		if err != nil {
			return nil, err
		}
		return out, nil
	case agentproto.CallProcInput:
		var req agentproto.ProcInput
		if err := decode(&req); err != nil {
			return nil, err
		}
		return nil, t.input(req)
	case agentproto.CallProcSignal:
		var req agentproto.ProcSignal
		if err := decode(&req); err != nil {
			return nil, err
		}
		return nil, t.signal(req)
	}
	return nil, fmt.Errorf("unknown call %q", op)
}
