package e2bfront

import (
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// Files: the filesystem service's calls and the plain /files reads and
// writes, each one of the daemon's file operations (run by the guest
// agent as the call's user, judged and audited by the daemon).

// entryOf is E2B's EntryInfo of a daemon file entry.
func entryOf(e wire.FileEntry) entryInfo {
	out := entryInfo{Name: e.Name, Path: cmp.Or(e.Abs, e.Path), Size: e.Size, Mode: e.Mode, Owner: e.Owner, Group: e.Group,
		ModifiedTime: time.Unix(0, e.ModTime).UTC(), Permissions: permissions(e)}
	switch e.Type {
	case wire.FileTypeDir:
		out.Type = fileTypeDirectory
	case wire.FileTypeSymlink:
		out.Type = fileTypeSymlink
		t := e.Target
		out.SymlinkTarget = &t
	default:
		out.Type = fileTypeFile
	}
	return out
}

// permissions renders a mode as ls does ("drwxr-xr-x").
func permissions(e wire.FileEntry) string {
	m := fs.FileMode(e.Mode & 0o777)
	switch e.Type {
	case wire.FileTypeDir:
		m |= fs.ModeDir
	case wire.FileTypeSymlink:
		m |= fs.ModeSymlink
	}
	if e.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if e.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if e.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m.String()
}

func (c *envdCall) fileReq(p string) wire.FileRequest { return wire.FileRequest{Path: p, User: c.user} }

func (c *envdCall) statEntry(ctx context.Context, p string) (*entryInfo, error) {
	e, err := c.api.FileStat(ctx, c.rec.ID, c.fileReq(p))
	if err != nil {
		return nil, apiToRPC("stat", err)
	}
	info := entryOf(*e)
	return &info, nil
}

func (f *Front) stat(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req pathRequest
	if err := decodeUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	e, err := c.statEntry(r.Context(), req.Path)
	writeUnary(w, entryResponse{Entry: e}, err)
}

func (f *Front) listDir(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req listDirRequest
	if err := decodeUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	depth := int(max(req.Depth, 1))
	if depth > wire.MaxListDepth {
		writeUnary(w, nil, rpcErr(codeInvalidArgument, "depth: at most %d", wire.MaxListDepth))
		return
	}
	fr := c.fileReq(req.Path)
	fr.Depth = depth
	l, err := c.api.FileList(r.Context(), c.rec.ID, fr)
	if err != nil {
		writeUnary(w, nil, apiToRPC("list", err))
		return
	}
	out := listDirResponse{Entries: []entryInfo{}}
	for _, e := range l.Entries {
		out.Entries = append(out.Entries, entryOf(e))
	}
	writeUnary(w, out, nil)
}

// makeDir makes a directory and its parents; one that is there already is
// already_exists (the SDKs answer false).
func (f *Front) makeDir(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req pathRequest
	if err := decodeUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	ctx := r.Context()
	if _, err := c.api.FileStat(ctx, c.rec.ID, c.fileReq(req.Path)); err == nil {
		writeUnary(w, nil, rpcErr(codeAlreadyExists, "%s exists", req.Path))
		return
	}
	fr := c.fileReq(req.Path)
	fr.Parents = true
	if err := c.api.FileOp(ctx, c.rec.ID, wire.FileOpMkdir, fr); err != nil {
		writeUnary(w, nil, apiToRPC("make directory", err))
		return
	}
	e, err := c.statEntry(ctx, req.Path)
	writeUnary(w, entryResponse{Entry: e}, err)
}

func (f *Front) move(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req moveRequest
	if err := decodeUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	fr := c.fileReq(req.Source)
	fr.To = req.Destination
	if err := c.api.FileOp(r.Context(), c.rec.ID, wire.FileOpMove, fr); err != nil {
		writeUnary(w, nil, apiToRPC("move", err))
		return
	}
	e, err := c.statEntry(r.Context(), req.Destination)
	writeUnary(w, entryResponse{Entry: e}, err)
}

func (f *Front) remove(w http.ResponseWriter, r *http.Request, c *envdCall) {
	var req pathRequest
	if err := decodeUnary(r, &req); err != nil {
		writeUnary(w, nil, err)
		return
	}
	fr := c.fileReq(req.Path)
	fr.Recursive = true
	if err := c.api.FileOp(r.Context(), c.rec.ID, wire.FileOpRemove, fr); err != nil {
		writeUnary(w, nil, apiToRPC("remove", err))
		return
	}
	writeUnary(w, struct{}{}, nil)
}

// filesError answers /files with E2B's error body.
func filesError(w http.ResponseWriter, status int, msg string) {
	cpError(w, status, msg)
}

// filesFail answers /files with the daemon's refusal, mapped onto the
// statuses the SDKs read (404: no such file; 507: no space).
func filesFail(w http.ResponseWriter, what string, err error) {
	var ae *client.APIError
	if !errors.As(err, &ae) {
		filesError(w, http.StatusBadGateway, what+": "+err.Error())
		return
	}
	status := ae.Status
	switch ae.Body.FileError {
	case wire.FileNotFound:
		status = http.StatusNotFound
	case wire.FileDenied:
		status = http.StatusForbidden
	case wire.FileIsDir, wire.FileNotDir:
		status = http.StatusBadRequest
	case wire.FileTooBig:
		status = http.StatusRequestEntityTooLarge
	}
	filesError(w, status, what+": "+ae.Body.Message())
}

// files authenticates a /files call (token or signed URL) and reads its
// user.
func (f *Front) files(op string, h func(http.ResponseWriter, *http.Request, *envdCall)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, msg := f.sandboxOf(r, func(rec sandboxRecord) bool { return signedOK(r, op, rec, time.Now()) })
		if c == nil {
			filesError(w, http.StatusUnauthorized, msg)
			return
		}
		c.user = mapUser(r.URL.Query().Get("username"))
		h(w, r, c)
	}
}

func (f *Front) readFile(w http.ResponseWriter, r *http.Request, c *envdCall) {
	p := r.URL.Query().Get("path")
	if p == "" {
		filesError(w, http.StatusBadRequest, "path: required")
		return
	}
	hw := &lazyHeader{w: w}
	_, err := c.api.FileRead(r.Context(), c.rec.ID, c.fileReq(p), hw)
	switch {
	case err == nil:
		hw.finish()
	case !hw.wrote:
		filesFail(w, "read "+p, err)
	}
	// Once bytes went out, a cut body is the error.
}

// lazyHeader sends 200 and the octet-stream type with the first byte, so
// that an error before it can still be answered.
type lazyHeader struct {
	w     http.ResponseWriter
	wrote bool
}

func (h *lazyHeader) Write(p []byte) (int, error) {
	if !h.wrote {
		h.wrote = true
		h.w.Header().Set("Content-Type", "application/octet-stream")
		h.w.WriteHeader(http.StatusOK)
	}
	return h.w.Write(p)
}

// finish answers an empty file.
func (h *lazyHeader) finish() {
	if !h.wrote {
		h.w.Header().Set("Content-Type", "application/octet-stream")
		h.w.Header().Set("Content-Length", "0")
		h.w.WriteHeader(http.StatusOK)
	}
}

// writeFiles writes one file (octet-stream with ?path=) or several
// (multipart, one part "file" each, named by its filename, the path; a
// ?path= names the first). Missing parents are made.
func (f *Front) writeFiles(w http.ResponseWriter, r *http.Request, c *envdCall) {
	r.Body = http.MaxBytesReader(w, r.Body, f.cfg.MaxUpload)
	body := io.Reader(r.Body)
	switch enc := strings.ToLower(r.Header.Get("Content-Encoding")); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			filesError(w, http.StatusBadRequest, "gzip body: "+err.Error())
			return
		}
		defer zr.Close()
		body = io.LimitReader(zr, f.cfg.MaxUpload+1)
	default:
		filesError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("Content-Encoding %q: gzip or none", truncate(enc, 40)))
		return
	}
	qpath := r.URL.Query().Get("path")
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	var out []writtenFile
	switch {
	case mt == "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		seen := map[string]bool{}
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				filesError(w, http.StatusBadRequest, "multipart body: "+err.Error())
				return
			}
			p := partPath(part)
			if qpath != "" && len(out) == 0 {
				p = qpath
			}
			if p == "" {
				filesError(w, http.StatusBadRequest, "a part names no file (filename) and the request no path")
				return
			}
			if seen[p] {
				filesError(w, http.StatusBadRequest, fmt.Sprintf("%s: written twice in one request", p))
				return
			}
			seen[p] = true
			wf, ok := f.writeOne(w, r, c, p, part)
			if !ok {
				return
			}
			out = append(out, wf)
		}
	case qpath == "":
		filesError(w, http.StatusBadRequest, "path: required for a body that is not multipart")
		return
	default:
		wf, ok := f.writeOne(w, r, c, qpath, body)
		if !ok {
			return
		}
		out = append(out, wf)
	}
	if len(out) == 0 {
		filesError(w, http.StatusBadRequest, "no file in the request")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// partPath is a part's filename with its directories (multipart.Part's
// FileName keeps only the base).
func partPath(part *multipart.Part) string {
	_, params, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// writeOne writes one file, making its missing parents first.
func (f *Front) writeOne(w http.ResponseWriter, r *http.Request, c *envdCall, p string, body io.Reader) (writtenFile, bool) {
	ctx := r.Context()
	if dir := path.Dir(p); dir != "." && dir != "/" {
		fr := c.fileReq(dir)
		fr.Parents = true
		if err := c.api.FileOp(ctx, c.rec.ID, wire.FileOpMkdir, fr); err != nil {
			filesFail(w, "write "+p, err)
			return writtenFile{}, false
		}
	}
	if _, err := c.api.FileWrite(ctx, c.rec.ID, c.fileReq(p), 0, body); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			filesError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("upload over %d bytes", f.cfg.MaxUpload))
		} else {
			filesFail(w, "write "+p, err)
		}
		return writtenFile{}, false
	}
	full := p
	if !path.IsAbs(p) {
		if e, err := c.api.FileStat(ctx, c.rec.ID, c.fileReq(p)); err == nil && e.Abs != "" {
			full = e.Abs
		}
	}
	return writtenFile{Name: path.Base(p), Type: "file", Path: full}, true
}
