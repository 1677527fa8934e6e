package e2bfront

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// Terminals (pty.create). The daemon's background processes have no
// terminal, so a process started with a pty is a command on a terminal in
// the sandbox's session (an exec with a TTY, decided and audited as any
// command), held by the door rather than by the stream that started it:
// a client that goes away kills nothing, and Connect follows it again;
// Update resizes it (the exec stream's resize frames). The guest does not
// name it, so the door does: its pids start at ptyPIDBase, above every
// pid a Linux guest gives (pid_max is at most 2^22).

const ptyPIDBase = 1 << 30

// ptyProc is one terminal command.
type ptyProc struct {
	pid     uint32
	sandbox string
	cfg     processConfig
	input   *io.PipeWriter
	resize  chan wire.TTY
	cancel  context.CancelFunc

	mu   sync.Mutex
	subs map[chan []byte]struct{}
	done chan struct{}
	end  *endEvent
}

// ptys are the door's terminal commands.
type ptys struct {
	mu   sync.Mutex
	next uint32
	m    map[uint32]*ptyProc
}

func (t *ptys) add(p *ptyProc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[uint32]*ptyProc{}
	}
	t.next++
	p.pid = ptyPIDBase + t.next
	t.m[p.pid] = p
}

func (t *ptys) get(sandbox string, pid uint32) *ptyProc {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.m[pid]
	if p == nil || p.sandbox != sandbox {
		return nil
	}
	return p
}

func (t *ptys) remove(pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m, pid)
}

// running lists a sandbox's terminal commands.
func (t *ptys) running(sandbox string) []processInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []processInfo
	for _, p := range t.m {
		if p.sandbox == sandbox {
			out = append(out, processInfo{Config: p.cfg, PID: p.pid})
		}
	}
	return out
}

// Write broadcasts the terminal's output to the streams that follow it.
func (p *ptyProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for ch := range p.subs {
		select {
		case ch <- append([]byte(nil), b...):
		default:
			// A stream that does not keep up loses this output, as a
			// terminal's reader does; the command is not held back.
		}
	}
	return len(b), nil
}

func (p *ptyProc) subscribe() chan []byte {
	ch := make(chan []byte, 256)
	p.mu.Lock()
	p.subs[ch] = struct{}{}
	p.mu.Unlock()
	return ch
}

func (p *ptyProc) unsubscribe(ch chan []byte) {
	p.mu.Lock()
	delete(p.subs, ch)
	p.mu.Unlock()
}

// startPTY starts req's command on a terminal and streams it.
func (f *Front) startPTY(w http.ResponseWriter, r *http.Request, c *envdCall, req *startRequest, exec wire.ExecRequest) {
	size := req.PTY.Size
	if size == nil || size.Cols == 0 || size.Rows == 0 {
		startStream(w).end(rpcErr(codeInvalidArgument, "start: a pty needs its size (cols, rows)"))
		return
	}
	term := req.Process.Envs["TERM"]
	if term == "" {
		term = "xterm-256color"
	}
	if exec.Shell {
		// A terminal runs what it was given, as its argv.
		exec.Argv, exec.Shell, exec.Login = append([]string{req.Process.Cmd}, req.Process.Args...), false, false
	}
	exec.TTY, exec.Stdin = &wire.TTY{Term: term, Cols: size.Cols, Rows: size.Rows}, true
	// TERM is the terminal's (above), not a variable for the env rules.
	exec.Env, exec.Secrets = procEnv(c.rec.Env, withoutKey(req.Process.Envs, "TERM"))
	ctx, cancel := context.WithCancel(f.ctx)
	pr, pw := io.Pipe()
	p := &ptyProc{sandbox: c.rec.ID, cfg: *req.Process, input: pw, resize: make(chan wire.TTY, 4), cancel: cancel,
		subs: map[chan []byte]struct{}{}, done: make(chan struct{})}
	if p.cfg.Envs == nil {
		p.cfg.Envs = map[string]string{}
	}
	f.ptys.add(p)
	sub := p.subscribe()
	go func() {
		defer close(p.done)
		defer f.ptys.remove(p.pid)
		defer cancel()
		res, err := c.api.Exec(ctx, exec, client.ExecIO{Stdin: pr, Stdout: p, Stderr: p, Resize: p.resize})
		_ = pr.Close()
		p.mu.Lock()
		p.end = endOfResult(res, err)
		p.mu.Unlock()
	}()
	f.streamPTY(r.Context(), w, p, sub)
}

// endOfResult is the end event of a terminal command.
func endOfResult(res *wire.Result, err error) *endEvent {
	e := &endEvent{ExitCode: -1}
	switch {
	case err != nil:
		e.Status = err.Error()
	case res.Signal != "":
		e.Status = "signal: " + res.Signal
	default:
		e.ExitCode, e.Exited, e.Status = int32(res.ExitCode), true, fmt.Sprintf("exit status %d", res.ExitCode)
	}
	if res != nil && res.TimedOut {
		e.Status += " (its time limit ended it)"
	}
	if e.ExitCode != 0 {
		msg := e.Status
		e.Error = &msg
	}
	return e
}

// streamPTY sends a terminal's start, its output from now on and its end;
// the command goes on when the client goes away.
func (f *Front) streamPTY(ctx context.Context, w http.ResponseWriter, p *ptyProc, sub chan []byte) {
	defer p.unsubscribe(sub)
	s := startStream(w)
	if err := s.send(processEvent{Event: eventOneof{Start: &startEvent{PID: p.pid}}}); err != nil {
		return
	}
	keep := newKeepalive(f.cfg.Keepalive)
	defer keep.Stop()
	for {
		select {
		case b := <-sub:
			if err := s.send(processEvent{Event: eventOneof{Data: &dataEvent{PTY: b}}}); err != nil {
				return
			}
			keep.Reset(f.cfg.Keepalive)
		case <-keep.C:
			if err := s.send(processEvent{Event: eventOneof{Keepalive: &struct{}{}}}); err != nil {
				return
			}
			keep.Reset(f.cfg.Keepalive)
		case <-p.done:
			for {
				select {
				case b := <-sub:
					if err := s.send(processEvent{Event: eventOneof{Data: &dataEvent{PTY: b}}}); err != nil {
						return
					}
					continue
				default:
				}
				break
			}
			p.mu.Lock()
			end := p.end
			p.mu.Unlock()
			if err := s.send(processEvent{Event: eventOneof{End: end}}); err == nil {
				s.end(nil)
			}
			return
		case <-ctx.Done():
			return
		}
	}
}

// ptyOf is the terminal command sel names in c's sandbox, or nil.
func (f *Front) ptyOf(c *envdCall, sel *processSelector) *ptyProc {
	if sel == nil || sel.PID == nil || *sel.PID <= ptyPIDBase {
		return nil
	}
	return f.ptys.get(c.rec.ID, *sel.PID)
}

// write sends input to the terminal; one that has ended is not found.
func (p *ptyProc) write(b []byte) error {
	select {
	case <-p.done:
		return rpcErr(codeNotFound, "process with pid %d has ended", p.pid)
	default:
	}
	if _, err := p.input.Write(b); err != nil {
		return rpcErr(codeNotFound, "process with pid %d: its input is closed", p.pid)
	}
	return nil
}

// keepalive is a timer for a stream's keepalive events.
type keepalive struct{ *time.Timer }

func newKeepalive(d time.Duration) keepalive { return keepalive{time.NewTimer(d)} }

func withoutKey(m map[string]string, key string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

// update resizes a terminal (pty.resize).
func (f *Front) update(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req updateRequest
	if err := decodeUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	t := f.ptyOf(c, req.Process)
	switch {
	case t == nil:
		writeUnary(w, nil, rpcErr(codeNotFound, "no terminal with that pid in the sandbox (only a pty.create process has one)"))
		return
	case req.PTY == nil || req.PTY.Size == nil || req.PTY.Size.Cols == 0 || req.PTY.Size.Rows == 0:
		writeUnary(w, nil, rpcErr(codeInvalidArgument, "update: pty.size with cols and rows"))
		return
	}
	select {
	case t.resize <- wire.TTY{Cols: req.PTY.Size.Cols, Rows: req.PTY.Size.Rows}:
	case <-t.done:
		writeUnary(w, nil, rpcErr(codeNotFound, "process with pid %d has ended", t.pid))
		return
	case <-r.Context().Done():
		return
	}
	writeUnary(w, struct{}{}, nil)
}
