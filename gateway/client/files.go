package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/vmgate/vmgate/gateway/wire"
)

// filesPath is the path of file operation op in session.
func filesPath(session, op string) string {
	return "/v1/sessions/" + url.PathEscape(session) + "/files/" + op
}

// FileStat returns the entry of f.Path in the caller's session's guest,
// as f.User (lstat: a symlink's own).
func (c *Client) FileStat(ctx context.Context, session string, f wire.FileRequest) (*wire.FileEntry, error) {
	var out wire.FileEntry
	if err := c.callBody(ctx, http.MethodPost, filesPath(session, wire.FileOpStat), f, http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("stat %s in session %s: %w", f.Path, session, err)
	}
	return &out, nil
}

// FileList lists the directory f.Path to f.Depth (at least 1).
func (c *Client) FileList(ctx context.Context, session string, f wire.FileRequest) (*wire.FileList, error) {
	var out wire.FileList
	if err := c.callBody(ctx, http.MethodPost, filesPath(session, wire.FileOpList), f, http.StatusOK, &out); err != nil {
		return nil, fmt.Errorf("list %s in session %s: %w", f.Path, session, err)
	}
	return &out, nil
}

// FileOp runs mkdir (f.Parents), move (f.To) or remove (f.Recursive).
func (c *Client) FileOp(ctx context.Context, session, op string, f wire.FileRequest) error {
	if err := c.callBody(ctx, http.MethodPost, filesPath(session, op), f, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("%s %s in session %s: %w", op, f.Path, session, err)
	}
	return nil
}

// fileQuery is a read's or a write's query.
func fileQuery(f wire.FileRequest) url.Values {
	q := url.Values{"path": {f.Path}}
	if f.User != "" {
		q.Set("user", f.User)
	}
	if f.Dir != "" {
		q.Set("dir", f.Dir)
	}
	return q
}

// FileRead copies the file f.Path of the session's guest to w and returns
// its bytes.
func (c *Client) FileRead(ctx context.Context, session string, f wire.FileRequest, w io.Writer) (int64, error) {
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://vmgated"+filesPath(session, wire.FileOpRead)+"?"+fileQuery(f).Encode(), nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.httpClient().Do(hreq)
	if err != nil {
		return 0, c.requestErr(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("read %s in session %s: %w", f.Path, session, apiError(resp))
	}
	n, err := io.Copy(w, resp.Body)
	if err != nil {
		return n, fmt.Errorf("read %s in session %s: %w", f.Path, session, c.requestErr(ctx, err))
	}
	return n, nil
}

// FileWrite writes r into the file f.Path of the session's guest
// (created with mode, 0: 0644, or truncated) and returns its bytes.
func (c *Client) FileWrite(ctx context.Context, session string, f wire.FileRequest, mode uint32, r io.Reader) (int64, error) {
	q := fileQuery(f)
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://vmgated"+filesPath(session, wire.FileOpWrite)+"?"+q.Encode(), r)
	if err != nil {
		return 0, err
	}
	hreq.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.httpClient().Do(hreq)
	if err != nil {
		return 0, c.requestErr(ctx, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("write %s in session %s: %w", f.Path, session, apiError(resp))
	}
	var out wire.FileWritten
	if err := decodeJSON(resp.Body, &out); err != nil {
		return 0, err
	}
	return out.Bytes, nil
}

// decodeJSON decodes one JSON answer (at most 1 MiB) into v.
func decodeJSON(r io.Reader, v any) error {
	return json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(v)
}
