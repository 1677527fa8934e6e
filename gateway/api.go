package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/exec", s.handleExec)
	mux.HandleFunc("GET /v1/sessions", s.handleListSessions)
	mux.HandleFunc("DELETE /v1/sessions/{name}", s.handleEndSession)
	mux.HandleFunc("POST /v1/sessions/{name}/hold", s.handleHoldSession)
	mux.HandleFunc("POST /v1/sessions/{name}/pause", s.handlePauseSession)
	mux.HandleFunc("POST /v1/sessions/{name}/fork", s.handleForkSession)
	mux.HandleFunc("POST /v1/sessions/{name}/publish", s.handlePublish)
	mux.HandleFunc("POST /v1/sessions/{name}/net-lock", s.handleNetLockSession)
	mux.HandleFunc("GET /v1/status", s.handleStatus)
	mux.HandleFunc("POST /v1/audit/rotate", s.handleAuditRotate)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		refuse(w, wire.KindNotFound, "no such endpoint: "+r.Method+" "+r.URL.Path)
	})
	return mux
}

// refuse answers a plain API request with a refusal of kind.
func refuse(w http.ResponseWriter, kind *wire.Kind, msg string) {
	writeError(w, kind.Status, wire.Error{Code: kind.Code, Error: msg})
}

func writeError(w http.ResponseWriter, status int, e wire.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(e)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) handleListSessions(w http.ResponseWriter, r *http.Request) {
	id, err := identityFrom(r.Context())
	if err != nil {
		refuse(w, wire.KindUnidentified, err.Error())
		return
	}
	out := s.listSessions(id)
	if out == nil {
		out = []wire.Session{}
	}
	writeJSON(w, out)
}

// callerSession is the caller's session named in the request's path, or
// nil after an error answer.
func (s *Server) callerSession(w http.ResponseWriter, r *http.Request) *session {
	id, err := identityFrom(r.Context())
	if err != nil {
		refuse(w, wire.KindUnidentified, err.Error())
		return nil
	}
	name := r.PathValue("name")
	s.mu.Lock()
	ss := s.sessions[sessionKey{id.Key(), name}]
	s.mu.Unlock()
	if ss == nil {
		refuse(w, wire.KindNotFound, fmt.Sprintf("no session %q of this caller", name))
	}
	return ss
}

// sessionOp runs op on the caller's session named in the path, through
// the exec core (Server.onSession), decided by decide. op's
// *RequestError is the answer; otherwise op has written it.
func (s *Server) sessionOp(w http.ResponseWriter, r *http.Request, decide sessionDecider, op func(context.Context, *session, *execState) error) {
	ss := s.callerSession(w, r)
	if ss == nil {
		return
	}
	id, _ := identityFrom(r.Context())
	if rerr := s.onSession(r.Context(), id, ss, decide, op); rerr != nil {
		writeError(w, rerr.Kind.Status, rerr.Wire())
	}
}

// handlePauseSession pauses the caller's session to disk: its VM and
// slot are freed, and its next command resumes it. A paused session's
// answer is the same.
func (s *Server) handlePauseSession(w http.ResponseWriter, r *http.Request) {
	s.sessionOp(w, r, decideSession(), func(ctx context.Context, ss *session, st *execState) error {
		if !ss.paused() {
			ss.mu.Lock()
			ss.limits = st.verdict.Limits.Paused // today's policy
			ss.mu.Unlock()
			if err := s.pause(ctx, ss, "asked by its owner", true); err != nil {
				return err
			}
		}
		writeJSON(w, ss.info())
		return nil
	})
}

// handleForkSession makes new sessions, each a copy of the caller's
// session's state: wire.ForkRequest in, the new sessions out.
func (s *Server) handleForkSession(w http.ResponseWriter, r *http.Request) {
	var req wire.ForkRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, wire.MaxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		refuse(w, wire.KindBadRequest, "fork: "+err.Error())
		return
	}
	s.sessionOp(w, r, decideSession(req.Names...), func(ctx context.Context, ss *session, st *execState) error {
		out, err := s.fork(ctx, ss, st, req.Names)
		if err != nil {
			return err
		}
		writeJSON(w, out)
		return nil
	})
}

func (s *Server) handleEndSession(w http.ResponseWriter, r *http.Request) {
	ss := s.callerSession(w, r)
	if ss == nil {
		return
	}
	s.destroySession(ss, "ended by client")
	w.WriteHeader(http.StatusNoContent)
}

// handleHoldSession ties a session to the request's connection: the
// answer's head says it is held, and when the connection closes (its
// process ended, even by SIGKILL) the session is ended. It returns when
// the session ends or the daemon stops.
func (s *Server) handleHoldSession(w http.ResponseWriter, r *http.Request) {
	ss := s.callerSession(w, r)
	if ss == nil {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "held\n")
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	select {
	case <-r.Context().Done():
		s.destroySession(ss, "its holder went away")
	case <-ss.ended:
	case <-s.stopped:
	}
}

func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	id, err := identityFrom(r.Context())
	if err != nil {
		refuse(w, wire.KindUnidentified, "cannot identify the caller: "+err.Error())
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), wire.Upgrade) {
		refuse(w, wire.KindBadRequest, "exec needs the header Upgrade: "+wire.Upgrade)
		return
	}
	// The body is read before the request counts as in flight, and in
	// bounded time: a client that stalls it holds up neither others nor
	// a shutdown.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(requestReadTimeout))
	req, err := wire.DecodeExecRequest(r.Body)
	if err != nil {
		refuse(w, wire.KindBadRequest, err.Error())
		return
	}
	_ = rc.SetReadDeadline(time.Time{})
	st := newExecState(id, req, false)
	log := s.log.With("req", st.reqID, "uid", id.UID, "pid", id.PID)
	// Queueing and booting end when the client goes away.
	a, rerr := s.admit(r.Context(), log, st)
	if rerr != nil {
		writeError(w, rerr.Kind.Status, rerr.Wire())
		return
	}
	conn, brw, err := rc.Hijack()
	if err != nil {
		a.Abort()
		log.Error("hijack", "err", err)
		return
	}
	defer conn.Close()
	_, _ = fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\nVmgate-Request-Id: %s\r\n\r\n", wire.Upgrade, st.reqID)
	if err := brw.Flush(); err != nil {
		a.Abort()
		return
	}
	s.serveExec(conn, brw.Reader, a)
}

// frameWriter turns writes into frames of one type on a shared connection.
// A client that takes none of a frame for writeStall is gone: stalled
// says so (and the exec ends).
type frameWriter struct {
	mu      *sync.Mutex
	w       net.Conn
	typ     byte
	err     error
	stalled func()
	stop    context.Context // the shutdown grace period: over, no write waits
}

// writeDeadline is when a write to an exec's client gives up: writeStall
// from now, or now once the shutdown grace period is over.
func writeDeadline(stop context.Context) time.Time {
	if stop.Err() != nil {
		return time.Now()
	}
	return time.Now().Add(writeStall)
}

func (f *frameWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return 0, f.err
	}
	_ = f.w.SetWriteDeadline(writeDeadline(f.stop))
	defer func() {
		if f.err != nil && f.stalled != nil {
			f.stalled()
		}
	}()
	for rest := p; len(rest) > 0; {
		n := min(len(rest), wire.MaxFrame)
		if err := wire.WriteFrame(f.w, f.typ, rest[:n]); err != nil {
			f.err = err
			return 0, err
		}
		rest = rest[n:]
	}
	return len(p), nil
}

// serveExec relays an admitted HTTP exec as frames on the upgraded
// connection.
func (s *Server) serveExec(conn net.Conn, br *bufio.Reader, a *admitted) {
	st := a.st
	// A client that stalls its output frames ends the command (stalled).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// When the grace period after shutdown ends, blocked reads and writes
	// of a client that stopped reading end too.
	defer context.AfterFunc(s.execCtx, func() { _ = conn.SetDeadline(time.Now()) })()

	// Client → daemon frames. A read error means the client is gone:
	// clientGone ends the command.
	var stdinR *io.PipeReader
	var stdinW *io.PipeWriter
	if st.req.Stdin {
		stdinR, stdinW = io.Pipe()
	}
	signals := make(chan string, 8)
	clientGone := make(chan struct{})
	files, puts := newPutPipes(len(st.req.Put))
	go func() {
		defer close(clientGone)
		for {
			typ, p, err := wire.ReadFrame(br)
			if err != nil {
				if stdinW != nil {
					stdinW.CloseWithError(errors.New("client disconnected"))
				}
				puts.abort(errors.New("client disconnected"))
				return
			}
			switch typ {
			case wire.FramePut:
				puts.write(p)
			case wire.FramePutEnd:
				puts.end()
			case wire.FrameStdin:
				if stdinW != nil {
					if _, err := stdinW.Write(p); err != nil {
						stdinW = nil // command closed its stdin; drop the rest
					}
				}
			case wire.FrameStdinEOF:
				if stdinW != nil {
					stdinW.Close()
					stdinW = nil
				}
			case wire.FrameSignal:
				select {
				case signals <- string(p):
				default:
				}
			}
		}
	}()

	var mu sync.Mutex
	sio := execIO{
		stdout:  &frameWriter{mu: &mu, w: conn, typ: wire.FrameStdout, stalled: cancel, stop: s.execCtx},
		stderr:  &frameWriter{mu: &mu, w: conn, typ: wire.FrameStderr, stalled: cancel, stop: s.execCtx},
		signals: signals, gone: clientGone, files: files,
	}
	files.getStream = &frameWriter{mu: &mu, w: conn, typ: wire.FrameGet, stalled: cancel, stop: s.execCtx}
	files.getEnd = func(t wire.Transfer) error {
		mu.Lock()
		defer mu.Unlock()
		_ = conn.SetWriteDeadline(writeDeadline(s.execCtx))
		return wire.WriteJSONFrame(conn, wire.FrameGetEnd, t)
	}
	if stdinR != nil {
		sio.stdin = stdinR
		defer stdinR.Close()
	}
	res, err := a.Run(ctx, sio)
	mu.Lock()
	defer mu.Unlock()
	_ = conn.SetWriteDeadline(writeDeadline(s.execCtx))
	if err != nil {
		kind := wire.KindVM
		if te := (*TransferError)(nil); errors.As(err, &te) {
			kind = wire.KindTransfer
		}
		_ = wire.WriteJSONFrame(conn, wire.FrameError, wire.Error{Code: kind.Code, Error: clientMessage(err), RequestID: st.reqID, Profile: st.verdict.Profile,
			Receipt: res.Receipt})
		return
	}
	_ = wire.WriteJSONFrame(conn, wire.FrameResult, res)
}

// putPipes feeds the client's put frames to the request's puts, one
// stream after the other.
type putPipes struct {
	w   []*io.PipeWriter
	cur int
}

func newPutPipes(n int) (*transferIO, *putPipes) {
	files, pp := &transferIO{}, &putPipes{}
	for range n {
		r, w := io.Pipe()
		files.puts, pp.w = append(files.puts, r), append(pp.w, w)
	}
	return files, pp
}

// write passes on put data; data the daemon no longer reads (a refused
// put) and data beyond the last put are dropped.
func (pp *putPipes) write(p []byte) {
	if pp.cur < len(pp.w) {
		_, _ = pp.w[pp.cur].Write(p)
	}
}

// end ends the current put's stream.
func (pp *putPipes) end() {
	if pp.cur < len(pp.w) {
		pp.w[pp.cur].Close()
		pp.cur++
	}
}

func (pp *putPipes) abort(err error) {
	for _, w := range pp.w[min(pp.cur, len(pp.w)):] {
		w.CloseWithError(err)
	}
}
