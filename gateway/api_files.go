package gateway

// The local API of file operations in a session's guest (package wire,
// files.go): each is run by the guest agent as the request's user, with a
// share of the session as a command has, and is one audit record.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// filesAPI serves /v1/sessions/{name}/files.
type filesAPI struct{ s *Server }

func (a filesAPI) routes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/sessions/{name}/files/{op}", a.op)
	mux.HandleFunc("GET /v1/sessions/{name}/files/read", a.read)
	mux.HandleFunc("PUT /v1/sessions/{name}/files/write", a.write)
}

// op runs stat, list, mkdir, move or remove.
func (a filesAPI) op(w http.ResponseWriter, r *http.Request) {
	op := r.PathValue("op")
	switch op {
	case wire.FileOpStat, wire.FileOpList, wire.FileOpMkdir, wire.FileOpMove, wire.FileOpRemove:
	default:
		refuse(w, wire.KindNotFound, "no file operation "+op+" (stat, list, mkdir, move, remove; GET read, PUT write)")
		return
	}
	f, err := wire.DecodeFileRequest(r.Body, op)
	if err != nil {
		refuse(w, wire.KindBadRequest, err.Error())
		return
	}
	a.run(w, r, op, f, func(ctx context.Context, v *vm.VM, as vm.FSCaller) (any, int64, error) {
		switch op {
		case wire.FileOpStat:
			e, err := v.FSStat(ctx, as, f.Path)
			if err != nil {
				return nil, 0, err
			}
			return entryOf(*e), 0, nil
		case wire.FileOpList:
			depth, most := max(f.Depth, 1), f.Max
			if most == 0 {
				most = wire.MaxListEntries
			}
			l, err := v.FSList(ctx, as, f.Path, depth, int(most))
			if err != nil {
				return nil, 0, err
			}
			out := wire.FileList{Entries: make([]wire.FileEntry, 0, len(l.Entries)), Truncated: l.Truncated}
			for _, e := range l.Entries {
				out.Entries = append(out.Entries, entryOf(e))
			}
			return out, 0, nil
		case wire.FileOpMkdir:
			return nil, 0, v.FSMkdir(ctx, as, f.Path, f.Parents)
		case wire.FileOpMove:
			return nil, 0, v.FSMove(ctx, as, f.Path, f.To)
		default:
			return nil, 0, v.FSRemove(ctx, as, f.Path, f.Recursive)
		}
	})
}

// read answers a file's bytes (at most files.get_max_bytes).
func (a filesAPI) read(w http.ResponseWriter, r *http.Request) {
	f, ok := fileQuery(w, r, wire.FileOpRead)
	if !ok {
		return
	}
	a.run(w, r, wire.FileOpRead, f, func(ctx context.Context, v *vm.VM, as vm.FSCaller) (any, int64, error) {
		w.Header().Set("Content-Type", "application/octet-stream")
		var sink headerOnWrite
		sink.w = w
		n, err := v.FSRead(ctx, as, f.Path, a.verdictOf(ctx).Limits.Files.GetBytes, &sink)
		if err != nil && sink.wrote {
			return nil, n, errStreamed // the answer began: it ends here, cut
		}
		if err != nil {
			return nil, n, err
		}
		if !sink.wrote {
			w.WriteHeader(http.StatusOK)
		}
		return nil, n, errStreamed
	})
}

// write writes the request's body into a file (at most
// files.put_max_bytes), created or truncated.
func (a filesAPI) write(w http.ResponseWriter, r *http.Request) {
	f, ok := fileQuery(w, r, wire.FileOpWrite)
	if !ok {
		return
	}
	mode := uint64(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		var err error
		if mode, err = strconv.ParseUint(m, 8, 32); err != nil || mode > 0o7777 {
			refuse(w, wire.KindBadRequest, fmt.Sprintf("write: mode %q: an octal mode, at most 7777", m))
			return
		}
	}
	a.run(w, r, wire.FileOpWrite, f, func(ctx context.Context, v *vm.VM, as vm.FSCaller) (any, int64, error) {
		n, err := v.FSWrite(ctx, as, f.Path, uint32(mode), a.verdictOf(ctx).Limits.Files.PutBytes, r.Body)
		if err != nil {
			return nil, n, err
		}
		return wire.FileWritten{Bytes: n}, n, nil
	})
}

// verdictKey carries a file request's verdict to its operation.
type verdictKey struct{}

func (filesAPI) verdictOf(ctx context.Context) policy.Verdict {
	v, _ := ctx.Value(verdictKey{}).(policy.Verdict)
	return v
}

// run runs one file operation on the caller's session named in the
// path: decided (policy.DecideFile), run as the user with a share of the
// session, and audited as one record. It answers fn's value as JSON (nil:
// 204) unless fn answered itself (errStreamed).
func (a filesAPI) run(w http.ResponseWriter, r *http.Request, op string, f *wire.FileRequest, fn func(context.Context, *vm.VM, vm.FSCaller) (any, int64, error)) {
	ss := a.s.callerSession(w, r)
	if ss == nil {
		return
	}
	id, _ := identityFrom(r.Context())
	q := newSessionRequest(id, ss, op+" "+f.Path)
	var out any
	var n int64
	streamed := false
	src := ss.ImageSource // the image it began with; nil: not recorded
	if src == nil {
		src = a.s.host.ImageSourceOf(q.image)
	}
	imageUser := src.CommandUser()
	decide := func(p *policy.Policy, q *sessionRequest) policy.Verdict {
		return p.DecideFile(q.id, policy.FileRequest{Image: q.image, ImageUser: imageUser, User: f.User})
	}
	outcome := func(err error) audit.Record {
		rec := audit.Record{Kind: audit.KindFile, GuestUser: q.verdict.User, File: &audit.FileOp{Op: op, Path: f.Path, To: f.To, Bytes: n}}
		if err != nil && !errors.Is(err, errStreamed) {
			rec.Error = err.Error()
		}
		return rec
	}
	rerr := a.s.sessions.onRunningAs(r.Context(), q, ss, decide, outcome, func(ctx context.Context, v *vm.VM) error {
		ctx = context.WithValue(ctx, verdictKey{}, q.verdict)
		var err error
		out, n, err = fn(ctx, v, vm.FSCaller{User: q.verdict.User, Dir: f.Dir})
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

// fileQuery reads a read's or a write's request from its query.
func fileQuery(w http.ResponseWriter, r *http.Request, op string) (*wire.FileRequest, bool) {
	q := r.URL.Query()
	f := &wire.FileRequest{Path: q.Get("path"), User: q.Get("user"), Dir: q.Get("dir")}
	if err := f.Check(op); err != nil {
		refuse(w, wire.KindBadRequest, err.Error())
		return nil, false
	}
	return f, true
}

// headerOnWrite passes writes on to an answer, noting that it began.
type headerOnWrite struct {
	w     io.Writer
	wrote bool
}

func (h *headerOnWrite) Write(p []byte) (int, error) {
	h.wrote = true
	return h.w.Write(p)
}

// entryOf is a file entry as the wire carries it.
func entryOf(e vm.FileEntry) wire.FileEntry {
	return wire.FileEntry{Path: e.Path, Abs: e.Abs, Name: e.Name, Type: e.Type, Size: e.Size, Mode: e.Mode, ModTime: e.ModTime,
		UID: e.UID, GID: e.GID, Owner: e.Owner, Group: e.Group, Target: e.Target}
}
