package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// File operations in the guest: the agent's fs subcommand
// (agentproto.FSArgv) run as a command, as the caller's guest account in
// its working directory, so that the guest's permissions decide. What the
// guest writes back is bounded before it is read, and its JSON checked.
//
// Precondition of every method: the agent has agentproto.FeatureFS (Has).
// An older agent takes the subcommand for a transfer and fails it: the
// error is then ErrFSFailed.

// FSCaller is who runs a file operation in the guest, and where.
type FSCaller struct {
	// User is the guest account ("" or "root": root); see
	// ExecRequest.User.
	User string
	// Dir is the working directory that relative paths resolve against;
	// "": the account's home.
	Dir string
}

// Kinds of FSError (its Kind), one per agentproto.FSExit code.
var (
	ErrFileNotFound = errors.New("no such file or directory")
	ErrFileExists   = errors.New("file exists")
	ErrPermission   = errors.New("permission denied")
	ErrNotDir       = errors.New("not a directory")
	ErrIsDir        = errors.New("is a directory")
	ErrTooBig       = errors.New("file too big")
	// ErrFSFailed is any other failure: the message says what.
	ErrFSFailed = errors.New("file operation failed")
)

// fsKinds maps the fs subcommand's exit codes to FSError kinds.
var fsKinds = map[int]error{
	agentproto.FSExitNotFound: ErrFileNotFound,
	agentproto.FSExitExists:   ErrFileExists,
	agentproto.FSExitDenied:   ErrPermission,
	agentproto.FSExitNotDir:   ErrNotDir,
	agentproto.FSExitIsDir:    ErrIsDir,
	agentproto.FSExitTooBig:   ErrTooBig,
}

// FSError is a file operation that the guest refused or that failed.
type FSError struct {
	Op   string // agentproto.FSStat, …
	Kind error  // one of the kinds above
	// Status is the operation's exit status (-1: it was killed, by a
	// signal or its time limit).
	Status int
	// Msg is the guest's one-line message, without its "vmgate-agent fs
	// OP: " prefix: guest text, bounded.
	Msg string
}

func (e *FSError) Error() string {
	if e.Msg == "" {
		return "fs " + e.Op + ": " + e.Kind.Error()
	}
	return "fs " + e.Op + ": " + e.Kind.Error() + ": " + e.Msg
}

// Unwrap gives errors.Is the kind.
func (e *FSError) Unwrap() error { return e.Kind }

// Bounds of the file operations.
const (
	// fsTimeout bounds an operation other than read and write, and
	// fsStreamTimeout a read or a write (ctx may end either sooner).
	fsTimeout       = time.Minute
	fsStreamTimeout = 10 * time.Minute
	// maxEntryJSON bounds a stat's JSON, and is a list's room per entry
	// (paths of up to PATH_MAX bytes, escaped).
	maxEntryJSON = 32 << 10
	// maxListJSON bounds a whole list's JSON.
	maxListJSON = 64 << 20
	// maxFSStderr bounds the message read from a failure.
	maxFSStderr = 4 << 10
)

// boundedBuffer keeps the first max bytes written to it and counts the
// rest; it never fails, so that the guest is never blocked.
type boundedBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	max  int
	over bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); len(p) > room {
		b.over = true
		b.buf.Write(p[:max(room, 0)])
	} else {
		b.buf.Write(p)
	}
	return len(p), nil
}

// fsRun runs one file operation and maps its failure to an *FSError.
// stdout receives what the guest writes there; stdin, if not nil, is the
// operation's input.
func (v *VM) fsRun(ctx context.Context, as FSCaller, op string, o agentproto.FSOptions, stdin io.Reader, stdout io.Writer, timeout time.Duration, paths ...string) error {
	for _, p := range paths {
		if p == "" {
			return fmt.Errorf("fs %s: an empty path", op)
		}
	}
	stderr := &boundedBuffer{max: maxFSStderr}
	res, err := v.Exec(ctx, ExecRequest{
		Argv: agentproto.FSArgv(op, o, paths...), User: as.User, Dir: as.Dir,
		Stdin: stdin, Stdout: stdout, Stderr: stderr, Timeout: timeout,
	})
	if err != nil {
		return fmt.Errorf("fs %s: %w", op, err)
	}
	if res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	e := &FSError{Op: op, Kind: ErrFSFailed, Status: res.ExitCode, Msg: fsMessage(stderr.buf.String(), op)}
	switch {
	case res.TimedOut:
		e.Msg = fmt.Sprintf("timed out after %v", timeout)
	case res.Signal != "":
		e.Msg = "killed by signal " + res.Signal
	default:
		if k := fsKinds[res.ExitCode]; k != nil {
			e.Kind = k
		}
	}
	return e
}

// fsMessage is the first line of a failure's stderr, without the
// subcommand's prefix: bounded guest text.
func fsMessage(stderr, op string) string {
	line, _, _ := strings.Cut(stderr, "\n")
	line = strings.TrimPrefix(line, "vmgate-agent fs "+op+": ")
	return guestText(strings.ToValidUTF8(line, "\uFFFD"))
}

// fsJSON runs an operation whose result is JSON of at most limit bytes
// and decodes it into v.
func (v *VM) fsJSON(ctx context.Context, as FSCaller, op string, o agentproto.FSOptions, limit int, into any, paths ...string) error {
	out := &boundedBuffer{max: limit}
	if err := v.fsRun(ctx, as, op, o, nil, out, fsTimeout, paths...); err != nil {
		return err
	}
	if out.over {
		return &FSError{Op: op, Kind: ErrTooBig, Msg: fmt.Sprintf("the answer is over %d bytes", limit)}
	}
	if err := json.Unmarshal(out.buf.Bytes(), into); err != nil {
		return fmt.Errorf("fs %s: %w: %w", op, ErrBadReply, err)
	}
	return nil
}

// FSStat describes the file at path (lstat: a symbolic link's own entry,
// its Target set).
func (v *VM) FSStat(ctx context.Context, as FSCaller, path string) (*agentproto.FileEntry, error) {
	var e agentproto.FileEntry
	if err := v.fsJSON(ctx, as, agentproto.FSStat, agentproto.FSOptions{}, maxEntryJSON, &e, path); err != nil {
		return nil, err
	}
	if err := checkFileEntry(e); err != nil {
		return nil, fmt.Errorf("fs stat: %w: %w", ErrBadReply, err)
	}
	return &e, nil
}

// FSList lists the directory at path (or the one a symbolic link there
// names): its entries, depth first in name order, to depth levels (1:
// its own entries; at most agentproto.MaxListDepth), at most max entries
// (at most agentproto.MaxListEntries; Truncated says that it cut the
// list). A listing whose JSON is over its bound (a very deep tree of very
// long names) is ErrTooBig: ask for fewer entries.
func (v *VM) FSList(ctx context.Context, as FSCaller, path string, depth, max int) (*agentproto.FileList, error) {
	if depth < 1 || depth > agentproto.MaxListDepth || max < 1 || max > agentproto.MaxListEntries {
		return nil, fmt.Errorf("fs ls: depth %d (1 to %d), max %d (1 to %d)", depth, agentproto.MaxListDepth, max, agentproto.MaxListEntries)
	}
	var l agentproto.FileList
	limit := min(maxListJSON, 64<<10+max*maxEntryJSON/8)
	if err := v.fsJSON(ctx, as, agentproto.FSList, agentproto.FSOptions{Depth: depth, Max: int64(max)}, limit, &l, path); err != nil {
		return nil, err
	}
	if len(l.Entries) > max {
		return nil, fmt.Errorf("fs ls: %w: %d entries, asked for at most %d", ErrBadReply, len(l.Entries), max)
	}
	for _, e := range l.Entries {
		if err := checkFileEntry(e); err != nil {
			return nil, fmt.Errorf("fs ls: %w: %w", ErrBadReply, err)
		}
	}
	return &l, nil
}

// checkFileEntry checks an entry as the guest describes it.
func checkFileEntry(e agentproto.FileEntry) error {
	switch e.Type {
	case agentproto.FileRegular, agentproto.FileDir, agentproto.FileSymlink, agentproto.FileOther:
	default:
		return fmt.Errorf("type %.20q", e.Type)
	}
	switch {
	case e.Path == "" || e.Name == "":
		return errors.New("an entry without a path or a name")
	case e.Size < 0 || e.Mode > 0o7777:
		return fmt.Errorf("size %d, mode %o", e.Size, e.Mode)
	case e.Abs != "" && !strings.HasPrefix(e.Abs, "/"):
		return errors.New("an absolute path that is not absolute")
	case e.Target != "" && e.Type != agentproto.FileSymlink:
		return errors.New("a target for an entry that is not a symbolic link")
	}
	return nil
}

// FSMkdir makes the directory path; with parents, its missing parents
// too, and a directory already there is no error.
func (v *VM) FSMkdir(ctx context.Context, as FSCaller, path string, parents bool) error {
	return v.fsRun(ctx, as, agentproto.FSMkdir, agentproto.FSOptions{Parents: parents}, nil, io.Discard, fsTimeout, path)
}

// FSMove renames from to to, as rename(2): in one file system, replacing
// a file or an empty directory at to (ErrFileExists: one with entries).
func (v *VM) FSMove(ctx context.Context, as FSCaller, from, to string) error {
	return v.fsRun(ctx, as, agentproto.FSMove, agentproto.FSOptions{}, nil, io.Discard, fsTimeout, from, to)
}

// FSRemove removes a file, a symbolic link or an empty directory; with
// recursive, a directory and everything in it (ErrIsDir without).
func (v *VM) FSRemove(ctx context.Context, as FSCaller, path string, recursive bool) error {
	return v.fsRun(ctx, as, agentproto.FSRemove, agentproto.FSOptions{Recursive: recursive}, nil, io.Discard, fsTimeout, path)
}

// FSRead copies the file at path to w, at most max bytes (max > 0):
// ErrTooBig past it (and w may then have received max bytes). It returns
// the bytes written to w.
func (v *VM) FSRead(ctx context.Context, as FSCaller, path string, max int64, w io.Writer) (int64, error) {
	if max <= 0 {
		return 0, fmt.Errorf("fs read: a bound of %d bytes", max)
	}
	cw := &capWriter{w: w, limit: max}
	err := v.fsRun(ctx, as, agentproto.FSRead, agentproto.FSOptions{Max: max}, nil, cw, fsStreamTimeout, path)
	n, over := cw.counts()
	if err == nil && over {
		// The guest wrote more than it may, and said all went well.
		err = &FSError{Op: agentproto.FSRead, Kind: ErrTooBig, Msg: fmt.Sprintf("more than %d bytes", max)}
	}
	return min(n, max), err
}

// FSWrite writes r into the file at path, created with mode (0: 0644;
// exactly, not masked; a file that exists keeps its own) or truncated, at
// most max bytes (max > 0): past it, ErrTooBig, and the guest leaves no
// new file and an old one empty. It returns the bytes read from r.
func (v *VM) FSWrite(ctx context.Context, as FSCaller, path string, mode uint32, max int64, r io.Reader) (int64, error) {
	if max <= 0 || mode > 0o7777 {
		return 0, fmt.Errorf("fs write: a bound of %d bytes, mode %o", max, mode)
	}
	cr := &countingReader{r: io.LimitReader(r, max+1)}
	err := v.fsRun(ctx, as, agentproto.FSWrite, agentproto.FSOptions{Max: max, Mode: mode}, cr, io.Discard, fsStreamTimeout, path)
	return cr.count(), err
}

// countingReader counts what is read through it (Exec reads stdin on a
// goroutine of its own).
type countingReader struct {
	r  io.Reader
	mu sync.Mutex
	n  int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.mu.Lock()
	c.n += int64(n)
	c.mu.Unlock()
	return n, err
}

func (c *countingReader) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
