package gateway

// The local API of sessions' background processes (package wire,
// procs.go): each handler parses the request and makes one call into the
// core: admit (a process's start is a command, decided and audited as
// one), or sessions.onRunning (an operation on a process, a request of
// its own on the running session).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/vm"
)

// procsAPI serves /v1/sessions/{name}/procs.
type procsAPI struct{ s *Server }

func (a procsAPI) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sessions/{name}/procs", a.start)
	mux.HandleFunc("GET /v1/sessions/{name}/procs", a.list)
	mux.HandleFunc("GET /v1/sessions/{name}/procs/{handle}/logs", a.logs)
	mux.HandleFunc("POST /v1/sessions/{name}/procs/{handle}/input", a.input)
	mux.HandleFunc("POST /v1/sessions/{name}/procs/{handle}/signal", a.signal)
	mux.HandleFunc("POST /v1/sessions/{name}/procs/{handle}/wait", a.wait)
}

// start starts a background process in the caller's session named in
// the path (made, or resumed, as a command's would be): an ExecRequest
// without a terminal or transfers; its Stdin keeps the process's input
// open. The answer is the process, at once.
func (a procsAPI) start(w http.ResponseWriter, r *http.Request) {
	id, err := identityFrom(r.Context())
	if err != nil {
		refuse(w, wire.KindUnidentified, err.Error())
		return
	}
	req, err := wire.DecodeExecRequest(r.Body)
	if err != nil {
		refuse(w, wire.KindBadRequest, err.Error())
		return
	}
	name := r.PathValue("name")
	switch {
	case req.TTY != nil || len(req.Put)+len(req.Get) > 0 || req.Receipt:
		refuse(w, wire.KindBadRequest, "a background process has no terminal, file transfers or receipt")
		return
	case req.Session != "" && req.Session != name:
		refuse(w, wire.KindBadRequest, fmt.Sprintf("the request names session %q, the path %q", req.Session, name))
		return
	}
	req.Session = name
	st := newExecState(id, req, false)
	st.detach = true
	log := a.s.log.With("req", st.reqID, "uid", id.UID, "pid", id.PID)
	ad, rerr := a.s.admit(r.Context(), log, st)
	if rerr != nil {
		writeError(w, rerr.Kind.Status, rerr.Wire())
		return
	}
	p, rerr := ad.Detach(r.Context())
	if rerr != nil {
		writeError(w, rerr.Kind.Status, rerr.Wire())
		return
	}
	w.WriteHeader(http.StatusCreated)
	writeJSON(w, p)
}

// list answers the session's processes, oldest first.
func (a procsAPI) list(w http.ResponseWriter, r *http.Request) {
	a.on(w, r, "list background processes", func(ctx context.Context, _ *sessionRequest, v *vm.VM) (any, error) {
		infos, err := v.ProcList(ctx)
		if err != nil {
			return nil, err
		}
		out := make([]wire.Proc, 0, len(infos))
		for _, i := range infos {
			out = append(out, procOf(i))
		}
		return out, nil
	})
}

// logs answers a process's output from ?since= (default 0: the oldest
// kept), at most ?max= bytes (default: all there is), as JSON lines of
// wire.ProcOutput; with ?follow=1 it goes on as the process writes, until
// it ends.
func (a procsAPI) logs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	since, err1 := queryInt(q.Get("since"), 0)
	limit, err2 := queryInt(q.Get("max"), 0)
	follow := q.Get("follow") == "1" || q.Get("follow") == "true"
	if err := firstErr(err1, err2); err != nil || since < 0 || limit < 0 {
		refuse(w, wire.KindBadRequest, fmt.Sprintf("logs: since and max are non-negative integers (%v)", err))
		return
	}
	a.onHandleAs(w, r, "logs of background process", follow, func(ctx context.Context, _ *sessionRequest, v *vm.VM, h int64) (any, error) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		flusher, _ := w.(http.Flusher)
		sent, end := int64(0), int64(-1)
		for {
			want := int64(vm.MaxLogsChunk)
			if limit > 0 {
				want = min(want, limit-sent)
			}
			lr := vm.ProcLogsRequest{Handle: h, Since: since, Max: want}
			if follow {
				lr.WaitMS = vm.MaxLogsWait / 2
			}
			out, err := v.ProcLogs(ctx, lr)
			if err != nil {
				if yielded(ctx) {
					// A pause or a fork goes first; the follow ends
					// here, before the process did.
					return nil, errStreamed
				}
				if sent == 0 && since == lr.Since {
					return nil, err
				}
				return nil, errStreamed // the answer began: it ends here
			}
			page := outputOf(*out)
			if err := enc.Encode(page); err != nil {
				return nil, errStreamed
			}
			if flusher != nil {
				flusher.Flush()
			}
			for _, c := range out.Chunks {
				sent += int64(len(c.Data))
			}
			since = out.Next
			if end < 0 {
				end = out.Info.Next // without follow: what it had written when asked
			}
			done := since >= end && !follow || since >= out.Info.Next && out.Info.State == vm.ProcExited
			if done || (limit > 0 && sent >= limit) {
				return nil, errStreamed
			}
		}
	})
}

// input writes to a process's input (wire.ProcInput).
func (a procsAPI) input(w http.ResponseWriter, r *http.Request) {
	in, err := wire.DecodeProcInput(r.Body)
	if err != nil {
		refuse(w, wire.KindBadRequest, err.Error())
		return
	}
	a.onHandle(w, r, "input to background process", func(ctx context.Context, _ *sessionRequest, v *vm.VM, h int64) (any, error) {
		return nil, v.ProcInput(ctx, h, in.Data, in.EOF)
	})
}

// signal sends a signal to a process's process group (wire.ProcSignal).
func (a procsAPI) signal(w http.ResponseWriter, r *http.Request) {
	sig, err := wire.DecodeProcSignal(r.Body)
	if err != nil {
		refuse(w, wire.KindBadRequest, err.Error())
		return
	}
	a.onHandle(w, r, "signal "+sig.Signal+" to background process", func(ctx context.Context, _ *sessionRequest, v *vm.VM, h int64) (any, error) {
		return nil, v.ProcSignal(ctx, h, sig.Signal)
	})
}

// wait answers a process once it has ended, or when ?timeout_ms= (default
// and at most 10 min) is over: then it still runs.
func (a procsAPI) wait(w http.ResponseWriter, r *http.Request) {
	ms, err := queryInt(r.URL.Query().Get("timeout_ms"), maxProcWait.Milliseconds())
	if err != nil || ms <= 0 {
		refuse(w, wire.KindBadRequest, "wait: timeout_ms is a positive integer")
		return
	}
	limit := time.Duration(min(ms, maxProcWait.Milliseconds())) * time.Millisecond
	a.onHandleAs(w, r, "wait for background process", true, func(ctx context.Context, _ *sessionRequest, v *vm.VM, h int64) (any, error) {
		deadline := time.Now().Add(limit)
		// Its state now first: what a wait cut short answers.
		now, err := v.ProcLogs(ctx, vm.ProcLogsRequest{Handle: h})
		if err != nil {
			return nil, err
		}
		last := &now.Info
		if last.State == vm.ProcExited {
			return procOf(*last), nil
		}
		for {
			left := time.Until(deadline)
			out, err := v.ProcLogs(ctx, vm.ProcLogsRequest{Handle: h, WaitMS: max(1, min(left, vm.MaxLogsWait*time.Millisecond).Milliseconds())})
			if err != nil && yielded(ctx) {
				// A pause or a fork goes first: the wait answers now,
				// the process still running.
				return procOf(*last), nil
			}
			if err != nil {
				return nil, err
			}
			last = &out.Info
			if out.Info.State == vm.ProcExited || time.Until(deadline) <= 0 {
				return procOf(out.Info), nil
			}
		}
	})
}

// maxProcWait bounds one wait request.
const maxProcWait = 10 * time.Minute

// errStreamed ends an operation whose answer it wrote itself.
var errStreamed = errors.New("answered")

// on runs op on the caller's running session named in the path (resumed
// when paused), as a request of its own named what, and answers op's
// value as JSON (nil: 204).
func (a procsAPI) on(w http.ResponseWriter, r *http.Request, what string, op func(context.Context, *sessionRequest, *vm.VM) (any, error)) {
	a.onAs(w, r, what, false, op)
}

// onAs is on; a watch (a logs follow, a wait) runs with a context that
// ends when a pause, a resume or a fork of the session starts to wait
// for it (session.watchCtx): it ends its answer then.
func (a procsAPI) onAs(w http.ResponseWriter, r *http.Request, what string, watch bool, op func(context.Context, *sessionRequest, *vm.VM) (any, error)) {
	ss := a.s.callerSession(w, r)
	if ss == nil {
		return
	}
	id, _ := identityFrom(r.Context())
	q := newSessionRequest(id, ss, what)
	var out any
	streamed := false
	rerr := a.s.sessions.onRunning(r.Context(), q, ss, func(ctx context.Context, v *vm.VM) (err error) {
		if watch {
			var cancel context.CancelFunc
			ctx, cancel = ss.watchCtx(ctx)
			defer cancel()
		}
		out, err = op(ctx, q, v)
		if errors.Is(err, errStreamed) {
			streamed, err = true, nil
		}
		return err
	})
	switch {
	case streamed:
	case rerr != nil:
		writeError(w, rerr.Kind.Status, rerr.Wire())
	case out == nil:
		w.WriteHeader(http.StatusNoContent)
	default:
		writeJSON(w, out)
	}
}

// onHandle is on for the process named in the path.
func (a procsAPI) onHandle(w http.ResponseWriter, r *http.Request, what string, op func(context.Context, *sessionRequest, *vm.VM, int64) (any, error)) {
	a.onHandleAs(w, r, what, false, op)
}

// onHandleAs is onAs for the process named in the path.
func (a procsAPI) onHandleAs(w http.ResponseWriter, r *http.Request, what string, watch bool, op func(context.Context, *sessionRequest, *vm.VM, int64) (any, error)) {
	h, err := strconv.ParseInt(r.PathValue("handle"), 10, 64)
	if err != nil || h <= 0 {
		refuse(w, wire.KindBadRequest, fmt.Sprintf("%q is not a process handle (a positive integer)", r.PathValue("handle")))
		return
	}
	a.onAs(w, r, fmt.Sprintf("%s %d", what, h), watch, func(ctx context.Context, q *sessionRequest, v *vm.VM) (any, error) {
		q.process = h
		return op(ctx, q, v, h)
	})
}

// queryInt parses an optional integer query value (def when empty).
func queryInt(s string, def int64) (int64, error) {
	if s == "" {
		return def, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
