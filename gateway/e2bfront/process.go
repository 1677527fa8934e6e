package e2bfront

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

// Processes. Every E2B process is a background process of the sandbox's
// session: it outlives the stream that started it (a client that goes
// away kills nothing), and a later Connect streams it again. E2B names a
// process by its pid in the guest; the door finds its handle by listing.

// commandOf is the request that runs cfg: E2B's /bin/bash -l -c STRING is
// a shell string (the policy judges it as one, and the daemon runs it in
// the image's login shell, or sh -c without bash); anything else runs as
// the argv it is.
func commandOf(cfg *processConfig) wire.ExecRequest {
	if (cfg.Cmd == "/bin/bash" || cfg.Cmd == "bash") && len(cfg.Args) == 3 && cfg.Args[0] == "-l" && cfg.Args[1] == "-c" {
		return wire.ExecRequest{Argv: []string{cfg.Args[2]}, Shell: true, Login: true}
	}
	return wire.ExecRequest{Argv: append([]string{cfg.Cmd}, cfg.Args...)}
}

// configOf is the E2B config of a process's argv.
func configOf(p wire.Proc) processConfig {
	cfg := processConfig{Envs: map[string]string{}, Args: []string{}}
	argv := p.Argv
	if len(argv) == 4 && argv[0] == "bash" && argv[1] == "-l" && argv[2] == "-c" {
		argv = []string{"/bin/bash", "-l", "-c", argv[3]}
	}
	if len(argv) > 0 {
		cfg.Cmd, cfg.Args = argv[0], append(cfg.Args, argv[1:]...)
	}
	if p.Dir != "" {
		d := p.Dir
		cfg.Cwd = &d
	}
	return cfg
}

// endOf is the end event of an exited process.
func endOf(p wire.Proc) *endEvent {
	e := &endEvent{ExitCode: -1, Status: "exited"}
	switch {
	case p.ExitCode != nil:
		e.ExitCode, e.Exited = int32(*p.ExitCode), true
		e.Status = fmt.Sprintf("exit status %d", *p.ExitCode)
	case p.Signal != "":
		e.Status = "signal: " + p.Signal
	}
	if p.TimedOut {
		e.Status += " (its time limit ended it)"
	}
	if e.ExitCode != 0 {
		msg := e.Status
		e.Error = &msg
	}
	return e
}

func (f *Front) startProcess(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req startRequest
	err := readEnvelope(r.Body, &req)
	switch {
	case err != nil:
	case req.Process == nil || req.Process.Cmd == "":
		err = rpcErr(codeInvalidArgument, "start: process.cmd is required")
	}
	ms, terr := timeoutMS(r)
	if err == nil {
		err = terr
	}
	if err != nil {
		startStream(w).end(err)
		return
	}
	exec := commandOf(req.Process)
	exec.Session, exec.User, exec.TimeoutMS = c.rec.ID, c.user, ms
	exec.Env, exec.Secrets = procEnv(c.rec.Env, req.Process.Envs)
	exec.Stdin = req.Stdin != nil && *req.Stdin
	if req.Process.Cwd != nil {
		exec.Dir = *req.Process.Cwd
	}
	if !f.boxes.openStream(c.rec.ID, f.cfg.MaxStreams) {
		startStream(w).end(rpcErr(codeResourceExhausted, "the sandbox has %d process streams open, the most it may", f.cfg.MaxStreams))
		return
	}
	defer f.boxes.closeStream(c.rec.ID)
	if req.PTY != nil {
		f.startPTY(w, r, c, &req, exec)
		return
	}
	p, err := c.api.StartProc(r.Context(), c.rec.ID, exec)
	if err != nil {
		startStream(w).end(apiToRPC("start", err))
		return
	}
	f.stream(r.Context(), w, c, *p, 0)
}

// connectProcess streams a running process's output from now on.
func (f *Front) connectProcess(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req connectRequest
	if err := readEnvelope(r.Body, &req); err != nil {
		startStream(w).end(err)
		return
	}
	if t := f.ptyOf(c, req.Process); t != nil {
		if !f.boxes.openStream(c.rec.ID, f.cfg.MaxStreams) {
			startStream(w).end(rpcErr(codeResourceExhausted, "the sandbox has %d process streams open, the most it may", f.cfg.MaxStreams))
			return
		}
		defer f.boxes.closeStream(c.rec.ID)
		f.streamPTY(r.Context(), w, t, t.subscribe())
		return
	}
	p, err := f.findProc(r.Context(), c, req.Process)
	if err != nil {
		startStream(w).end(err)
		return
	}
	if !f.boxes.openStream(c.rec.ID, f.cfg.MaxStreams) {
		startStream(w).end(rpcErr(codeResourceExhausted, "the sandbox has %d process streams open, the most it may", f.cfg.MaxStreams))
		return
	}
	defer f.boxes.closeStream(c.rec.ID)
	f.stream(r.Context(), w, c, *p, p.Next)
}

// stream sends a process's start event, its output from since, keepalives
// while it is quiet, and its end. The process goes on when ctx ends.
func (f *Front) stream(ctx context.Context, w http.ResponseWriter, c *envdCall, p wire.Proc, since int64) {
	s := startStream(w)
	if err := s.send(processEvent{Event: eventOneof{Start: &startEvent{PID: uint32(p.PID)}}}); err != nil {
		return
	}
	last := p
	quietSince := time.Now()
	err := c.api.ProcLogs(ctx, c.rec.ID, p.Handle, since, 0, true, func(page wire.ProcOutput) error {
		last = page.Proc
		for _, ch := range page.Chunks {
			d := &dataEvent{}
			if ch.Stream == wire.StreamStderr {
				d.Stderr = ch.Data
			} else {
				d.Stdout = ch.Data
			}
			if err := s.send(processEvent{Event: eventOneof{Data: d}}); err != nil {
				return err
			}
			quietSince = time.Now()
		}
		if time.Since(quietSince) >= f.cfg.Keepalive {
			quietSince = time.Now()
			return s.send(processEvent{Event: eventOneof{Keepalive: &struct{}{}}})
		}
		return nil
	})
	switch {
	case ctx.Err() != nil:
		return // the client went away; the process goes on
	case err != nil:
		s.end(apiToRPC(fmt.Sprintf("output of process %d", p.PID), err))
		return
	case last.State != wire.ProcExited:
		s.end(rpcErr(codeInternal, "process %d: its output ended before it did", p.PID))
		return
	}
	if err := s.send(processEvent{Event: eventOneof{End: endOf(last)}}); err == nil {
		s.end(nil)
	}
}

// findProc finds the process a selector names (the running one with the
// pid, else the newest that had it).
func (f *Front) findProc(ctx context.Context, c *envdCall, sel *processSelector) (*wire.Proc, error) {
	if sel == nil || sel.PID == nil {
		return nil, rpcErr(codeInvalidArgument, "process: select it by pid (tags are not served)")
	}
	procs, err := c.api.Procs(ctx, c.rec.ID)
	if err != nil {
		return nil, apiToRPC("list processes", err)
	}
	var found *wire.Proc
	for i := range procs {
		if uint32(procs[i].PID) != *sel.PID {
			continue
		}
		if found == nil || procs[i].State == wire.ProcRunning || found.State != wire.ProcRunning && procs[i].Started.After(found.Started) {
			found = &procs[i]
		}
	}
	if found == nil {
		return nil, rpcErr(codeNotFound, "process with pid %d not found", *sel.PID)
	}
	return found, nil
}

// runningProc is findProc for a call that needs the process running.
func (f *Front) runningProc(ctx context.Context, c *envdCall, sel *processSelector) (*wire.Proc, error) {
	p, err := f.findProc(ctx, c, sel)
	if err == nil && p.State != wire.ProcRunning {
		err = rpcErr(codeNotFound, "process with pid %d has ended", p.PID)
	}
	return p, err
}

func (f *Front) listProcesses(w http.ResponseWriter, r *http.Request, c *envdCall) {
	if err := decodeUnary(r, &struct{}{}); err != nil {
		writeUnary(w, nil, err)
		return
	}
	procs, err := c.api.Procs(r.Context(), c.rec.ID)
	if err != nil {
		writeUnary(w, nil, apiToRPC("list processes", err))
		return
	}
	out := listResponse{Processes: f.ptys.running(c.rec.ID)}
	for _, p := range procs {
		if p.State == wire.ProcRunning {
			out.Processes = append(out.Processes, processInfo{Config: configOf(p), PID: uint32(p.PID)})
		}
	}
	slices.SortFunc(out.Processes, func(a, b processInfo) int { return int(a.PID) - int(b.PID) })
	writeUnary(w, out, nil)
}

func (f *Front) sendInput(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req sendInputRequest
	err := decodeUnary(r, &req)
	if err == nil && req.Input == nil {
		err = rpcErr(codeInvalidArgument, "input: stdin or pty bytes")
	}
	if t := f.ptyOf(c, req.Process); err == nil && t != nil {
		data := append(req.Input.PTY, req.Input.Stdin...)
		writeUnary(w, struct{}{}, t.write(data))
		return
	}
	if err == nil && req.Input.PTY != nil {
		err = rpcErr(codeInvalidArgument, "input: pty bytes to a process without a terminal")
	}
	f.onProc(w, r, c, err, req.Process, "send input", func(ctx context.Context, p *wire.Proc) error {
		return c.api.ProcInput(ctx, c.rec.ID, p.Handle, req.Input.Stdin, false)
	})
}

func (f *Front) closeStdin(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req closeStdinRequest
	err := decodeUnary(r, &req)
	if t := f.ptyOf(c, req.Process); err == nil && t != nil {
		_ = t.input.Close()
		writeUnary(w, struct{}{}, nil)
		return
	}
	f.onProc(w, r, c, err, req.Process, "close input", func(ctx context.Context, p *wire.Proc) error {
		return c.api.ProcInput(ctx, c.rec.ID, p.Handle, nil, true)
	})
}

func (f *Front) sendSignal(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req sendSignalRequest
	err := decodeUnary(r, &req)
	sig := ""
	switch req.Signal {
	case signalKill:
		sig = "KILL"
	case signalTerm:
		sig = "TERM"
	default:
		if err == nil {
			err = rpcErr(codeInvalidArgument, "signal %q: SIGNAL_SIGKILL or SIGNAL_SIGTERM", truncate(string(req.Signal), 40))
		}
	}
	if t := f.ptyOf(c, req.Process); err == nil && t != nil {
		// Ending the terminal's exec ends its command (and its group).
		t.cancel()
		writeUnary(w, struct{}{}, nil)
		return
	}
	f.onProc(w, r, c, err, req.Process, "signal", func(ctx context.Context, p *wire.Proc) error {
		return c.api.ProcSignal(ctx, c.rec.ID, p.Handle, sig)
	})
}

// onProc runs op on the running process sel names, answering {} or the
// error (err is the request's own, if any).
func (f *Front) onProc(w http.ResponseWriter, r *http.Request, c *envdCall, err error, sel *processSelector, what string, op func(context.Context, *wire.Proc) error) {
	if err != nil {
		writeUnary(w, nil, err)
		return
	}
	p, err := f.runningProc(r.Context(), c, sel)
	if err != nil {
		writeUnary(w, nil, err)
		return
	}
	if err := op(r.Context(), p); err != nil {
		writeUnary(w, nil, apiToRPC(what, err))
		return
	}
	writeUnary(w, struct{}{}, nil)
}

// decodeUnary reads a unary call's message.
func decodeUnary(r *http.Request, v any) error {
	body, err := readAll(r)
	if err != nil {
		return err
	}
	if len(body) == 0 {
		return nil
	}
	return decodeMessage(body, v)
}

func readAll(r *http.Request) ([]byte, error) {
	buf, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, rpcErr(codeResourceExhausted, "request message over %d bytes", mbe.Limit)
		}
		return nil, rpcErr(codeInvalidArgument, "request message: %v", err)
	}
	return buf, nil
}
