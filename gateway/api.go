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
	"github.com/vmgate/vmgate/internal/tty"
	"github.com/vmgate/vmgate/policy"
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
	procsAPI{s}.routes(mux)
	filesAPI{s}.routes(mux)
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
	writeJSON(w, s.sessions.list(id.Key(), false))
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
	ss := s.sessions.get(sessionKey{id.Key(), name})
	if ss == nil {
		refuse(w, wire.KindNotFound, fmt.Sprintf("no session %q of this caller", name))
	}
	return ss
}

// sessionOp runs op on the caller's session ss, as a request of its own
// (what names it) through sessions.operate, decided by decide. op's error
// is the answer; otherwise op's value is, as JSON.
func (s *Server) sessionOp(w http.ResponseWriter, r *http.Request, ss *session, what string, decide func(*policy.Policy, *sessionRequest) policy.Verdict,
	op func(context.Context, *sessionRequest) (any, error)) {
	id, _ := identityFrom(r.Context())
	q := newSessionRequest(id, ss, what)
	var out any
	rerr := s.sessions.operate(r.Context(), q, ss, decide, func(ctx context.Context) (err error) {
		out, err = op(ctx, q)
		return err
	})
	if rerr != nil {
		writeError(w, rerr.Kind.Status, rerr.Wire())
		return
	}
	writeJSON(w, out)
}

// handlePauseSession pauses the caller's session to disk: its VM and
// slot are freed, and its next command resumes it. A paused session's
// answer is the same.
func (s *Server) handlePauseSession(w http.ResponseWriter, r *http.Request) {
	ss := s.callerSession(w, r)
	if ss == nil {
		return
	}
	s.sessionOp(w, r, ss, "pause", decideSession(), func(ctx context.Context, q *sessionRequest) (any, error) {
		if ss.state() == stateRunning {
			ss.mu.Lock()
			ss.Paused = q.verdict.Limits.Paused // today's policy
			ss.mu.Unlock()
			if err := s.sessions.pause(ctx, ss, "asked by its owner", true); err != nil {
				return nil, err
			}
		}
		return ss.info(), nil
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
	ss := s.callerSession(w, r)
	if ss == nil {
		return
	}
	s.sessionOp(w, r, ss, "fork into "+strings.Join(req.Names, " "), decideSession(req.Names...), func(ctx context.Context, q *sessionRequest) (any, error) {
		return s.sessions.fork(ctx, ss, &q.request, req.Names)
	})
}

// handleNetLockSession locks the caller's session's network to the
// rules of a wire.NetLimit (none: no network) for the rest of its life;
// the answer is the session.
func (s *Server) handleNetLockSession(w http.ResponseWriter, r *http.Request) {
	l, err := wire.DecodeNetLimit(r.Body)
	if err != nil {
		refuse(w, wire.KindBadRequest, err.Error())
		return
	}
	want := policy.NetLimit(*l)
	ss := s.callerSession(w, r)
	if ss == nil {
		return
	}
	s.sessionOp(w, r, ss, "net-lock: allow ["+strings.Join(want.Allow, " ")+"]", decideNetLock(ss, want), func(_ context.Context, q *sessionRequest) (any, error) {
		if err := s.sessions.lockNet(ss, q, want); err != nil {
			return nil, err
		}
		return ss.info(), nil
	})
}

func (s *Server) handleEndSession(w http.ResponseWriter, r *http.Request) {
	ss := s.callerSession(w, r)
	if ss == nil {
		return
	}
	s.sessions.destroy(ss, "ended by client")
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
		s.sessions.destroy(ss, "its holder went away")
	case <-ss.ended:
	case <-s.flight.stopped:
	}
}

// upgrade answers a request with 101 Switching Protocols to proto,
// naming the request reqID, and returns its connection for the framed
// stream that follows. On error the connection is gone.
func upgrade(w http.ResponseWriter, proto, reqID string) (net.Conn, *bufio.Reader, error) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, nil, fmt.Errorf("hijack: %w", err)
	}
	_, _ = fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\nVmgate-Request-Id: %s\r\n\r\n", proto, reqID)
	if err := brw.Flush(); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, brw.Reader, nil
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
	conn, br, err := upgrade(w, wire.Upgrade, st.reqID)
	if err != nil {
		a.Abort()
		log.Warn("exec's upgrade", "err", err)
		return
	}
	defer conn.Close()
	s.serveExec(conn, br, a)
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
	defer context.AfterFunc(s.flight.grace, func() { _ = conn.SetDeadline(time.Now()) })()

	// Client → daemon frames. A read error means the client is gone:
	// clientGone ends the command.
	var stdinR *io.PipeReader
	var stdinW *io.PipeWriter
	if st.req.Stdin {
		stdinR, stdinW = io.Pipe()
	}
	signals := make(chan string, 8)
	resizes := make(chan wire.TTY, 8)
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
			case wire.FrameResize:
				// A size that does not parse, or of a command without a
				// terminal, is dropped, as a signal that cannot be sent.
				var sz wire.TTY
				if st.req.TTY != nil && json.Unmarshal(p, &sz) == nil && tty.SizeOK(sz.Cols, sz.Rows) {
					select {
					case resizes <- sz:
					default:
					}
				}
			}
		}
	}()

	var mu sync.Mutex
	sio := execIO{
		stdout:  &frameWriter{mu: &mu, w: conn, typ: wire.FrameStdout, stalled: cancel, stop: s.flight.grace},
		stderr:  &frameWriter{mu: &mu, w: conn, typ: wire.FrameStderr, stalled: cancel, stop: s.flight.grace},
		signals: signals, resize: resizes, gone: clientGone, files: files,
	}
	files.getStream = &frameWriter{mu: &mu, w: conn, typ: wire.FrameGet, stalled: cancel, stop: s.flight.grace}
	files.getEnd = func(t wire.Transfer) error {
		mu.Lock()
		defer mu.Unlock()
		_ = conn.SetWriteDeadline(writeDeadline(s.flight.grace))
		return wire.WriteJSONFrame(conn, wire.FrameGetEnd, t)
	}
	if stdinR != nil {
		sio.stdin = stdinR
		defer stdinR.Close()
	}
	res, err := a.Run(ctx, sio)
	mu.Lock()
	defer mu.Unlock()
	_ = conn.SetWriteDeadline(writeDeadline(s.flight.grace))
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
