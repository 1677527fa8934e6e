package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

// procsPath is the path of session's processes, or of process h's op.
func procsPath(session string, h int64, op string) string {
	p := "/v1/sessions/" + url.PathEscape(session) + "/procs"
	if h > 0 {
		p += "/" + strconv.FormatInt(h, 10) + "/" + op
	}
	return p
}

// StartProc starts req's command as a background process of the caller's
// session (made, or resumed, as a command's would be): it outlives the
// client, and its handle names it from now on. req.Stdin keeps its input
// open for ProcInput; a terminal and transfers are refused.
func (c *Client) StartProc(ctx context.Context, session string, req wire.ExecRequest) (*wire.Proc, error) {
	req.Session = session
	var out wire.Proc
	if err := c.callBody(ctx, http.MethodPost, procsPath(session, 0, ""), req, http.StatusCreated, &out); err != nil {
		return nil, fmt.Errorf("start a background process in session %s: %w", session, err)
	}
	return &out, nil
}

// Procs lists the background processes of the caller's session, oldest
// first.
func (c *Client) Procs(ctx context.Context, session string) ([]wire.Proc, error) {
	var out []wire.Proc
	if err := c.call(ctx, http.MethodGet, procsPath(session, 0, ""), http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("background processes of session %s: %w", session, err)
	}
	return out, nil
}

// ProcLogs reads process h's output from offset since, page by page (at
// most max bytes in all, 0: all there is), calling page for each; with
// follow it goes on as the process writes, until it ends or ctx ends.
// The last page's Next is where a later call goes on.
func (c *Client) ProcLogs(ctx context.Context, session string, h, since, max int64, follow bool, page func(wire.ProcOutput) error) error {
	q := url.Values{"since": {strconv.FormatInt(since, 10)}}
	if max > 0 {
		q.Set("max", strconv.FormatInt(max, 10))
	}
	if follow {
		q.Set("follow", "1")
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://vmgated"+procsPath(session, h, "logs")+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := c.httpClient().Do(hreq)
	if err != nil {
		return c.requestErr(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("logs of process %d of session %s: %w", h, session, apiError(resp))
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	ended := false
	for sc.Scan() {
		var p wire.ProcOutput
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return fmt.Errorf("logs of process %d: a bad page: %w", h, err)
		}
		ended = p.Proc.State == wire.ProcExited && p.Next >= p.Proc.Next
		if err := page(p); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return c.requestErr(ctx, err)
	}
	if follow && !ended && ctx.Err() == nil {
		return fmt.Errorf("logs of process %d of session %s: the daemon ended the stream before the process ended", h, session)
	}
	return ctx.Err()
}

// ProcInput writes data to process h's input and, with eof, closes it.
func (c *Client) ProcInput(ctx context.Context, session string, h int64, data []byte, eof bool) error {
	if err := c.callBody(ctx, http.MethodPost, procsPath(session, h, "input"), wire.ProcInput{Data: data, EOF: eof}, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("input to process %d of session %s: %w", h, session, err)
	}
	return nil
}

// ProcSignal sends signal (TERM, KILL, …) to process h's process group.
func (c *Client) ProcSignal(ctx context.Context, session string, h int64, signal string) error {
	if err := c.callBody(ctx, http.MethodPost, procsPath(session, h, "signal"), wire.ProcSignal{Signal: signal}, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("signal process %d of session %s: %w", h, session, err)
	}
	return nil
}

// ProcWait waits until process h has ended, at most timeout (0: the
// daemon's most, 10 min) per request and as long as ctx lasts, and
// returns it (still running when the wait's time was over).
func (c *Client) ProcWait(ctx context.Context, session string, h int64, timeout time.Duration) (*wire.Proc, error) {
	path := procsPath(session, h, "wait")
	if timeout > 0 {
		path += "?timeout_ms=" + strconv.FormatInt(max(timeout.Milliseconds(), 1), 10)
	}
	var out wire.Proc
	if err := c.call(ctx, http.MethodPost, path, http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("wait for process %d of session %s: %w", h, session, err)
	}
	return &out, nil
}
