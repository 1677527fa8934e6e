// Package client talks to vmgated over its Unix socket (package wire): it
// runs commands with streamed I/O and manages sessions. Errors are typed:
// *APIError for refusals (denied, busy, bad request) and *UnreachableError
// when the socket cannot be reached.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

// SocketPath returns explicit, else $VMGATE_SOCKET, else wire.DefaultSocket.
func SocketPath(explicit string) string {
	if explicit != "" {
		return explicit
	}
	if s := os.Getenv("VMGATE_SOCKET"); s != "" {
		return s
	}
	return wire.DefaultSocket
}

// Client is a vmgated client. The zero value is not usable; use New.
type Client struct {
	Socket string
	// Dial, when set, opens the connections instead of dialing Socket:
	// a front door inside the daemon reaches the API this way, as its
	// caller (gateway's door connections).
	Dial func(ctx context.Context) (net.Conn, error)
}

// New returns a client for the socket at path (see SocketPath).
func New(path string) *Client { return &Client{Socket: SocketPath(path)} }

// UnreachableError reports that the gateway socket could not be reached.
type UnreachableError struct {
	Socket string
	Err    error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach vmgated at %s: %v (is vmgated running? set VMGATE_SOCKET or --socket for another socket)", e.Socket, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// APIError is a refusal from the gateway.
type APIError struct {
	Status int
	Body   wire.Error
}

func (e *APIError) Error() string { return e.Body.Message() }

// Is lets errors.Is match ErrDenied and ErrBusy.
func (e *APIError) Is(target error) bool {
	switch target {
	case ErrDenied:
		return e.Body.Code == wire.CodeDenied
	case ErrBusy:
		return e.Body.Code == wire.CodeBusy
	}
	return false
}

// Sentinels matched by *APIError.
var (
	ErrDenied = errors.New("denied by policy")
	ErrBusy   = errors.New("gateway busy")
)

// ExecFailedError is a failure after the command was accepted (VM died,
// gateway shutting down).
type ExecFailedError struct{ Body wire.Error }

func (e *ExecFailedError) Error() string { return "exec failed: " + e.Body.Error }

func (c *Client) dial(ctx context.Context) (net.Conn, error) {
	if c.Dial != nil {
		return c.Dial(ctx)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return nil, &UnreachableError{Socket: c.Socket, Err: err}
	}
	return conn, nil
}

// httpClient makes one plain API request per connection: the Client is a
// plain value with no pool to close, so a kept-alive connection would stay
// open (and count against the daemon's per-uid bound) until collected.
func (c *Client) httpClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return c.dial(ctx)
	}}}
}

func apiError(resp *http.Response) error {
	var e wire.Error
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(body, &e) != nil || e.Error == "" {
		e = wire.Error{Code: wire.CodeInternal, Error: fmt.Sprintf("unexpected answer %s: %s", resp.Status, bytes.TrimSpace(body))}
	}
	return &APIError{Status: resp.StatusCode, Body: e}
}

// ExecIO wires a command's streams. Nil readers/writers mean empty stdin and
// discarded output. Signals forwards signal names ("INT", "TERM").
type ExecIO struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	Signals        <-chan string
	// Resize carries a TTY command's new sizes (Cols, Rows).
	Resize <-chan wire.TTY
	// Puts are the tar streams of the request's Put entries, in order;
	// each is sent to its end before stdin.
	Puts []io.Reader
	// Gets take the streams of the request's Get entries, in order. Each
	// is called with a reader of one get's checked tar stream, which ends
	// with an error if the daemon reports the get failed: a Get must keep
	// nothing unless it read the stream to a clean EOF.
	Gets []func(io.Reader) error
	// ReceiptNote, if set, is told what a receipt check could not
	// check (receipt.Body.Check's notes).
	ReceiptNote func(string)
}

// Exec runs req and streams its I/O. It returns the result record; a
// non-nil error means the command's outcome is unknown or it never ran,
// except a *ReceiptError, which comes with the result.
//
// With req.Receipt the daemon signs a receipt of the request (in
// Result.Receipt, or in the refusal's or failure's wire.Error.Receipt).
// Exec hashes the streams it received and sent itself and checks the
// receipt against them (receipt.Body.Check): a receipt that is missing,
// unreadable or disagrees is a *ReceiptError, and is removed from what
// Exec returns, so that a caller never keeps it.
// A get whose stream a Get refused has its Result.Transfers entry's Error
// set. Cancelling ctx closes the connection, which makes the gateway kill
// the command.
func (c *Client) Exec(ctx context.Context, req wire.ExecRequest, sio ExecIO) (*wire.Result, error) {
	req.Stdin = sio.Stdin != nil
	if len(sio.Puts) != len(req.Put) || len(sio.Gets) != len(req.Get) {
		return nil, errors.New("exec: one stream per put and one consumer per get")
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	var rc *receiptCheck
	if req.Receipt {
		rc = watchStreams(&sio)
	}
	res, err := c.exec(ctx, body, sio)
	if rc != nil {
		return rc.check(res, err, sio.ReceiptNote)
	}
	return res, err
}

// upgrade dials the daemon and posts body to path asking to switch to
// proto; once the daemon has answered 101 it returns the connection and
// its reader, and done, which the caller calls when finished with them.
// Cancelling ctx closes the connection. A refusal is an *APIError.
func (c *Client) upgrade(ctx context.Context, op, path, proto string, body []byte) (net.Conn, *bufio.Reader, func(), error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	done := func() { stop(); conn.Close() }
	fail := func(err error) (net.Conn, *bufio.Reader, func(), error) {
		done()
		return nil, nil, nil, err
	}
	hreq, err := http.NewRequest(http.MethodPost, "http://vmgated"+path, bytes.NewReader(body))
	if err != nil {
		return fail(fmt.Errorf("%s: %w", op, err))
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Connection", "Upgrade")
	hreq.Header.Set("Upgrade", proto)
	if err := hreq.Write(conn); err != nil {
		return fail(ctxOr(ctx, fmt.Errorf("%s: send request: %w", op, err)))
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, hreq)
	if err != nil {
		return fail(ctxOr(ctx, fmt.Errorf("%s: read response: %w", op, err)))
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return fail(apiError(resp))
	}
	return conn, br, done, nil
}

// exec sends the request body and relays the exec stream.
func (c *Client) exec(ctx context.Context, body []byte, sio ExecIO) (*wire.Result, error) {
	conn, br, done, err := c.upgrade(ctx, "exec", "/v1/exec", wire.Upgrade, body)
	if err != nil {
		return nil, err
	}
	defer done()
	in := &inputs{conn: conn}
	go in.send(ctx, sio)
	res, err := readFrames(br, sio)
	if lerr := in.failed(); lerr != nil {
		return nil, lerr // the connection was closed for it
	}
	if errors.Is(err, errConnLost) && ctx.Err() == nil {
		// The daemon went away in the middle (killed, restarted): the
		// command's outcome is unknown, as when it cannot be reached.
		return nil, &UnreachableError{Socket: c.Socket, Err: err}
	}
	return res, ctxOr(ctx, err)
}

// inputs sends the client's frames: puts, then stdin, and signals.
type inputs struct {
	conn net.Conn
	mu   sync.Mutex
	err  error // a local put stream that failed
}

func (in *inputs) frame(typ byte, p []byte) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return wire.WriteFrame(in.conn, typ, p)
}

func (in *inputs) failed() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.err
}

// stream sends r as frames of type typ; a local read error is returned
// as such, a write error as nil (the daemon's frames say why).
func (in *inputs) stream(typ byte, r io.Reader) (localErr error, ok bool) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 && in.frame(typ, buf[:n]) != nil {
			return nil, false
		}
		if errors.Is(err, io.EOF) {
			return nil, true
		}
		if err != nil {
			return err, false
		}
	}
}

func (in *inputs) send(ctx context.Context, sio ExecIO) {
	if sio.Signals != nil {
		go func() {
			for {
				select {
				case sig, ok := <-sio.Signals:
					if !ok {
						return
					}
					_ = in.frame(wire.FrameSignal, []byte(sig))
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	if sio.Resize != nil {
		go func() {
			for {
				select {
				case sz, ok := <-sio.Resize:
					if !ok {
						return
					}
					b, _ := json.Marshal(wire.TTY{Cols: sz.Cols, Rows: sz.Rows})
					_ = in.frame(wire.FrameResize, b)
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	for i, p := range sio.Puts {
		lerr, ok := in.stream(wire.FramePut, p)
		if lerr != nil {
			// A put that cannot be read locally cannot be sent whole: the
			// connection goes, and with it the command and a fresh VM.
			in.mu.Lock()
			in.err = fmt.Errorf("exec: put %d: %w", i, lerr)
			in.mu.Unlock()
			in.conn.Close()
			return
		}
		if !ok || in.frame(wire.FramePutEnd, nil) != nil {
			return
		}
	}
	if sio.Stdin != nil {
		// Stdin ends with an EOF frame whether it reached EOF or failed.
		_, _ = in.stream(wire.FrameStdin, sio.Stdin)
		_ = in.frame(wire.FrameStdinEOF, nil)
	}
}

// gets feeds get frames to the ExecIO's consumers, one get after another.
type gets struct {
	sio     ExecIO
	cur     int
	pw      *io.PipeWriter
	done    chan error
	results []error // of the consumers, by get
}

func (g *gets) data(p []byte) {
	if g.cur >= len(g.sio.Gets) {
		return
	}
	if g.pw == nil {
		pr, pw := io.Pipe()
		g.pw, g.done = pw, make(chan error, 1)
		consume := g.sio.Gets[g.cur]
		go func() {
			err := consume(pr)
			pr.CloseWithError(errors.New("the get's consumer stopped reading"))
			g.done <- err
		}()
	}
	_, _ = g.pw.Write(p)
}

// end ends the current get with the daemon's outcome t.
func (g *gets) end(t wire.Transfer) {
	if g.cur >= len(g.sio.Gets) {
		return
	}
	var err error
	switch {
	case g.pw == nil && t.Error == "":
		err = errors.New("no data")
	case g.pw != nil:
		if t.Error != "" {
			g.pw.CloseWithError(errors.New(t.Error))
		} else {
			g.pw.Close()
		}
		err = <-g.done
	}
	if t.Error != "" {
		err = nil // the daemon's reason is the one to report
	}
	g.results = append(g.results, err)
	g.pw, g.cur = nil, g.cur+1
}

// readFrames reads the daemon's frames until the final one.
func readFrames(br *bufio.Reader, sio ExecIO) (*wire.Result, error) {
	g := &gets{sio: sio}
	for {
		typ, p, err := wire.ReadFrame(br)
		if err != nil {
			if g.pw != nil {
				g.pw.CloseWithError(err)
				<-g.done
			}
			return nil, fmt.Errorf("%w during the command: %w", errConnLost, err)
		}
		switch typ {
		case wire.FrameStdout:
			if sio.Stdout != nil {
				_, _ = sio.Stdout.Write(p)
			}
		case wire.FrameStderr:
			if sio.Stderr != nil {
				_, _ = sio.Stderr.Write(p)
			}
		case wire.FrameGet:
			g.data(p)
		case wire.FrameGetEnd:
			var t wire.Transfer
			if err := json.Unmarshal(p, &t); err != nil {
				return nil, fmt.Errorf("exec: bad get end frame: %w", err)
			}
			g.end(t)
		case wire.FrameResult:
			var r wire.Result
			if err := json.Unmarshal(p, &r); err != nil {
				return nil, fmt.Errorf("exec: bad result frame: %w", err)
			}
			g.apply(&r)
			return &r, nil
		case wire.FrameError:
			var e wire.Error
			if err := json.Unmarshal(p, &e); err != nil {
				return nil, fmt.Errorf("exec: bad error frame: %w", err)
			}
			return nil, &ExecFailedError{Body: e}
		}
	}
}

// apply records the consumers' errors in r's gets.
func (g *gets) apply(r *wire.Result) {
	i := 0
	for j := range r.Transfers {
		t := &r.Transfers[j]
		if t.Direction != "get" {
			continue
		}
		if i < len(g.results) && g.results[i] != nil && t.Error == "" {
			t.Error = g.results[i].Error()
		}
		i++
	}
}

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("exec: %w", ctx.Err())
	}
	return err
}

// Sessions lists the caller's sessions.
func (c *Client) Sessions(ctx context.Context) ([]wire.Session, error) {
	var out []wire.Session
	if err := c.call(ctx, http.MethodGet, "/v1/sessions", http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("sessions: %w", err)
	}
	return out, nil
}

// EndSession destroys the caller's session name.
func (c *Client) EndSession(ctx context.Context, name string) error {
	if err := c.call(ctx, http.MethodDelete, "/v1/sessions/"+url.PathEscape(name), http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("end session %s: %w", name, err)
	}
	return nil
}

// PauseSession pauses the caller's session name to disk: its VM is
// freed, and its next command resumes it with everything it left.
func (c *Client) PauseSession(ctx context.Context, name string) (*wire.Session, error) {
	var out wire.Session
	if err := c.call(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(name)+"/pause", http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("pause session %s: %w", name, err)
	}
	return &out, nil
}

// ForkSession makes the caller's sessions newNames, each a copy of its
// session name's state at this moment; name keeps running (or paused).
func (c *Client) ForkSession(ctx context.Context, name string, newNames []string) ([]wire.Session, error) {
	var out []wire.Session
	if err := c.callBody(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(name)+"/fork", wire.ForkRequest{Names: newNames}, http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("fork session %s: %w", name, err)
	}
	return out, nil
}

// LockSessionNet locks the network of the caller's session name to the
// egress rules allow (none: no network) for the rest of its life: only a
// narrower lock may follow. Rules outside the profile's network or the
// present lock are refused (ErrDenied, naming the rule).
func (c *Client) LockSessionNet(ctx context.Context, name string, allow []string) (*wire.Session, error) {
	var out wire.Session
	if err := c.callBody(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(name)+"/net-lock", wire.NetLimit{Allow: allow}, http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("lock session %s's network: %w", name, err)
	}
	return &out, nil
}

// HoldSession ties the caller's session name to this process: the daemon
// ends the session when the connection it opens closes, which it does when
// ctx ends or the process dies (even by SIGKILL). It returns once the
// daemon holds the session; the hold lasts in the background.
func (c *Client) HoldSession(ctx context.Context, name string) error {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://vmgated/v1/sessions/"+url.PathEscape(name)+"/hold", nil)
	if err != nil {
		return err
	}
	resp, err := c.httpClient().Do(hreq)
	if err != nil {
		return fmt.Errorf("hold session %s: %w", name, c.requestErr(ctx, err))
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return fmt.Errorf("hold session %s: %w", name, apiError(resp))
	}
	go func() {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}()
	return nil
}

// Status returns the gateway's status: live VMs, the caller's (or, for an
// admin, every) command and session, the pools, the audit chain's head.
func (c *Client) Status(ctx context.Context) (*wire.Status, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var out wire.Status
	if err := c.call(ctx, http.MethodGet, "/v1/status", http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("status: %w", err)
	}
	return &out, nil
}

// errConnLost: the exec stream ended before its final frame.
var errConnLost = errors.New("connection to vmgated lost")

// RotateAudit asks the daemon to move its audit log aside and continue
// the chain in a new file; it returns where the old file went and the
// chain's head.
func (c *Client) RotateAudit(ctx context.Context) (*wire.Rotation, error) {
	var out wire.Rotation
	if err := c.call(ctx, http.MethodPost, "/v1/audit/rotate", http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("audit rotate: %w", err)
	}
	return &out, nil
}

// Metrics returns the daemon's metrics in the Prometheus text format.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://vmgated/metrics", nil)
	if err != nil {
		return "", fmt.Errorf("metrics: %w", err)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return "", c.requestErr(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", apiError(resp)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return "", fmt.Errorf("metrics: %w", err)
	}
	return string(b), nil
}

// call makes a plain API request and decodes a JSON answer into out (if
// non-nil) when the status is want.
func (c *Client) call(ctx context.Context, method, path string, want int, out any) error {
	return c.callBody(ctx, method, path, nil, want, out)
}

// callBody is call with a JSON request body (none when in is nil).
func (c *Client) callBody(ctx context.Context, method, path string, in any, want int, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	hreq, err := http.NewRequestWithContext(ctx, method, "http://vmgated"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		hreq.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.httpClient().Do(hreq)
	if err != nil {
		return c.requestErr(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return apiError(resp)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// requestErr is the error of a plain request whose connection failed: the
// daemon could not be reached, or it went away before its answer (killed,
// restarted), which leaves the request's outcome unknown as an
// unreachable daemon does: both are an *UnreachableError. A request whose
// ctx ended says so instead.
func (c *Client) requestErr(ctx context.Context, err error) error {
	var ue *UnreachableError
	switch {
	case errors.As(err, &ue):
		return ue
	case ctx.Err() != nil:
		return err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return &UnreachableError{Socket: c.Socket, Err: fmt.Errorf("%w before its answer: %w", errConnLost, err)}
	}
	return err
}
