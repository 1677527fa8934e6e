package agent

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// FS runs `vmgate-agent fs OP [flags] -- PATH…` (agentproto.FSArgv): one
// file operation, run as an ordinary command as the request's user in its
// working directory, so that the guest's own permissions decide, as they
// would for any process of that user. It returns the exit status, 0 or
// one of agentproto's FSExit codes, with a one-line message on stderr.
//
// Nothing here needs privileges: a path is used as the user's own
// process would use it (symbolic links are followed where a system call
// follows them: read, write, ls of its directory; stat, mv and rm act on
// the link itself).
//
// write stops at --max: past it nothing more is written, a file it
// created is removed and one that existed is left empty (its old content
// went at the open, as with a shell's `>`), and it exits FSExitTooBig.
func FS(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "vmgate-agent fs: want an operation")
		return agentproto.FSExitUsage
	}
	op := args[0]
	o, paths, err := parseFS(op, args[1:])
	if err == nil {
		err = runFS(op, o, paths, stdin, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "vmgate-agent fs %s: %s\n", op, oneLine(fsMessage(err)))
		return fsExitCode(err)
	}
	return 0
}

// fsOptions are an operation's flags.
type fsOptions struct {
	depth     int
	max       int64 // 0: none
	parents   bool
	recursive bool
	mode      uint32
}

// fsError is a failure with its exit code.
type fsError struct {
	code int
	msg  string
}

func (e *fsError) Error() string { return e.msg }

func fsFail(code int, format string, args ...any) error {
	return &fsError{code: code, msg: fmt.Sprintf(format, args...)}
}

// parseFS parses an operation's flags and paths: each operation takes
// only its own flags, and one path (mv: two).
func parseFS(op string, args []string) (fsOptions, []string, error) {
	o := fsOptions{depth: 1, mode: 0o644}
	fl := flag.NewFlagSet("fs "+op, flag.ContinueOnError)
	fl.SetOutput(io.Discard)
	var mode string
	paths := 1
	switch op {
	case agentproto.FSStat:
	case agentproto.FSMove:
		paths = 2
	case agentproto.FSList:
		fl.IntVar(&o.depth, "depth", 1, "")
		fl.Int64Var(&o.max, "max", agentproto.MaxListEntries, "")
	case agentproto.FSMkdir:
		fl.BoolVar(&o.parents, "parents", false, "")
	case agentproto.FSRemove:
		fl.BoolVar(&o.recursive, "recursive", false, "")
	case agentproto.FSRead:
		fl.Int64Var(&o.max, "max", 0, "")
	case agentproto.FSWrite:
		fl.Int64Var(&o.max, "max", 0, "")
		fl.StringVar(&mode, "mode", "", "")
	default:
		return o, nil, fsFail(agentproto.FSExitUsage, "unknown operation %q", op)
	}
	if err := fl.Parse(args); err != nil {
		return o, nil, fsFail(agentproto.FSExitUsage, "%v", err)
	}
	if fl.NArg() != paths {
		return o, nil, fsFail(agentproto.FSExitUsage, "want %d path(s), got %d", paths, fl.NArg())
	}
	for _, p := range fl.Args() {
		if p == "" {
			return o, nil, fsFail(agentproto.FSExitUsage, "an empty path")
		}
	}
	switch {
	case o.depth < 1 || o.depth > agentproto.MaxListDepth:
		return o, nil, fsFail(agentproto.FSExitUsage, "--depth %d: want 1 to %d", o.depth, agentproto.MaxListDepth)
	case o.max < 0:
		return o, nil, fsFail(agentproto.FSExitUsage, "--max %d", o.max)
	}
	if op == agentproto.FSList {
		o.max = min(max(o.max, 1), agentproto.MaxListEntries)
	}
	if mode != "" {
		m, err := strconv.ParseUint(mode, 8, 32)
		if err != nil || m > 0o7777 {
			return o, nil, fsFail(agentproto.FSExitUsage, "--mode %q: want octal permission bits", mode)
		}
		o.mode = uint32(m)
	}
	return o, fl.Args(), nil
}

// runFS runs one parsed operation.
func runFS(op string, o fsOptions, paths []string, stdin io.Reader, stdout io.Writer) error {
	switch op {
	case agentproto.FSStat:
		fi, err := os.Lstat(paths[0])
		if err != nil {
			return err
		}
		e := newNamer().entry(paths[0], fi)
		if abs, err := filepath.Abs(paths[0]); err == nil {
			e.Abs = abs
		}
		return writeJSON(stdout, e)
	case agentproto.FSList:
		return fsList(stdout, paths[0], o.depth, int(o.max))
	case agentproto.FSMkdir:
		return fsMkdir(paths[0], o.parents)
	case agentproto.FSMove:
		return fsMove(paths[0], paths[1])
	case agentproto.FSRemove:
		return fsRemove(paths[0], o.recursive)
	case agentproto.FSRead:
		return fsRead(stdout, paths[0], o.max)
	case agentproto.FSWrite:
		return fsWrite(stdin, paths[0], o.mode, o.max)
	}
	return fsFail(agentproto.FSExitUsage, "unknown operation %q", op)
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// namer gives uids and gids their names, looking each up once.
type namer struct {
	users, groups map[uint32]string
}

func newNamer() *namer { return &namer{users: map[uint32]string{}, groups: map[uint32]string{}} }

func (n *namer) user(uid uint32) string {
	name, ok := n.users[uid]
	if !ok {
		if u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
			name = u.Username
		}
		n.users[uid] = name
	}
	return name
}

func (n *namer) group(gid uint32) string {
	name, ok := n.groups[gid]
	if !ok {
		if g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10)); err == nil {
			name = g.Name
		}
		n.groups[gid] = name
	}
	return name
}

// entry describes the file at path as lstat found it (fi).
func (n *namer) entry(path string, fi fs.FileInfo) agentproto.FileEntry {
	e := agentproto.FileEntry{
		Path: path, Name: filepath.Base(path), Size: fi.Size(), ModTime: fi.ModTime().UnixNano(),
		Mode: uint32(fi.Mode().Perm()),
	}
	m := fi.Mode()
	if m&fs.ModeSetuid != 0 {
		e.Mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		e.Mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		e.Mode |= 0o1000
	}
	switch {
	case m.IsRegular():
		e.Type = agentproto.FileRegular
	case m.IsDir():
		e.Type = agentproto.FileDir
	case m&fs.ModeSymlink != 0:
		e.Type = agentproto.FileSymlink
		e.Target, _ = os.Readlink(path)
	default:
		e.Type = agentproto.FileOther
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = st.Uid, st.Gid
		e.Owner, e.Group = n.user(st.Uid), n.group(st.Gid)
	}
	return e
}

// fsList writes the entries under dir (a directory, or a symbolic link to
// one), depth first in name order, to depth levels and at most max
// entries (limit), as a FileList. The JSON is written as the walk goes, so that a
// large listing is never held whole; a subdirectory that cannot be read
// is listed without its entries.
func fsList(stdout io.Writer, dir string, depth, limit int) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &fs.PathError{Op: "ls", Path: dir, Err: syscall.ENOTDIR}
	}
	w := bufio.NewWriter(stdout)
	l := &lister{w: w, names: newNamer(), limit: limit, depth: depth}
	if _, err := w.WriteString(`{"entries":[`); err != nil {
		return err
	}
	if err := l.walk(dir, dir, 1); err != nil {
		return err
	}
	end := "]}\n"
	if l.truncated {
		end = `],"truncated":true}` + "\n"
	}
	if _, err := w.WriteString(end); err != nil {
		return err
	}
	return w.Flush()
}

// lister walks a directory tree for fsList.
type lister struct {
	w         *bufio.Writer
	names     *namer
	limit     int
	depth     int
	n         int
	truncated bool
}

// walk lists dir (shown as shown) at level; a directory that cannot be
// read below the first is skipped.
func (l *lister) walk(dir, shown string, level int) error {
	ents, err := os.ReadDir(dir)
	if err != nil && level == 1 {
		return err
	}
	for _, de := range ents { // in name order
		if l.n == l.limit {
			l.truncated = true
			return nil
		}
		fi, err := de.Info() // lstat
		if err != nil {
			continue // gone since
		}
		path, at := filepath.Join(shown, de.Name()), filepath.Join(dir, de.Name())
		if l.n > 0 {
			if err := l.w.WriteByte(','); err != nil {
				return err
			}
		}
		b, err := json.Marshal(l.names.entry(path, fi))
		if err != nil {
			return err
		}
		if _, err := l.w.Write(b); err != nil {
			return err
		}
		l.n++
		if fi.IsDir() && level < l.depth {
			if err := l.walk(at, path, level+1); err != nil || l.truncated {
				return err
			}
		}
	}
	return nil
}

// fsMkdir makes a directory; with parents, its missing parents too, and
// a directory that exists is no error.
func fsMkdir(path string, parents bool) error {
	if !parents {
		return os.Mkdir(path, 0o777)
	}
	err := os.MkdirAll(path, 0o777)
	if err != nil {
		if fi, serr := os.Lstat(path); serr == nil && !fi.IsDir() {
			return &fs.PathError{Op: "mkdir", Path: path, Err: syscall.EEXIST}
		}
	}
	return err
}

// fsMove is rename(2): os.Rename refuses any directory as the new name,
// where rename(2) replaces an empty one.
func fsMove(from, to string) error {
	for {
		err := syscall.Rename(from, to)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
		}
		return nil
	}
}

// fsRemove removes a file, a symbolic link or an empty directory; with
// recursive, a directory and all it holds.
func fsRemove(path string, recursive bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() && recursive {
		return os.RemoveAll(path)
	}
	err = os.Remove(path)
	if fi.IsDir() && errors.Is(err, syscall.ENOTEMPTY) {
		return fsFail(agentproto.FSExitIsDir, "%s: a directory with entries (remove it with --recursive)", path)
	}
	return err
}

// fsRead copies a file to stdout; past limit bytes (0: no bound) it
// fails with FSExitTooBig, before it writes anything when the file's size
// says so.
func fsRead(stdout io.Writer, path string, limit int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return &fs.PathError{Op: "read", Path: path, Err: syscall.EISDIR}
	}
	if limit == 0 {
		_, err = io.Copy(stdout, f)
		return err
	}
	tooBig := fsFail(agentproto.FSExitTooBig, "%s: more than %d bytes", path, limit)
	if fi.Mode().IsRegular() && fi.Size() > limit {
		return tooBig
	}
	if _, err := io.CopyN(stdout, f, limit); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	if n, _ := f.Read(make([]byte, 1)); n > 0 {
		return tooBig
	}
	return nil
}

// fsWrite writes stdin into the file at path, created with mode (exactly,
// not masked) or truncated; see FS for what happens past limit bytes (0:
// no bound).
func fsWrite(stdin io.Reader, path string, mode uint32, limit int64) error {
	f, created, err := openForWrite(path, mode)
	if err != nil {
		return err
	}
	if limit == 0 {
		_, err = io.Copy(f, stdin)
	} else if _, err = io.CopyN(f, stdin, limit); errors.Is(err, io.EOF) {
		err = nil
	} else if err == nil {
		if n, _ := io.ReadFull(stdin, make([]byte, 1)); n > 0 {
			_ = f.Truncate(0)
			_ = f.Close()
			if created {
				_ = os.Remove(path)
			}
			return fsFail(agentproto.FSExitTooBig, "%s: more than %d bytes", path, limit)
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// openForWrite opens path for writing: an existing file truncated, or a
// new one created with mode.
func openForWrite(path string, mode uint32) (f *os.File, created bool, err error) {
	for range 2 { // the file may come or go between the two opens
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if !errors.Is(err, fs.ErrNotExist) {
			return f, false, err
		}
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			if err := f.Chmod(fs.FileMode(mode&0o777) | modeBits(mode)); err != nil {
				_ = f.Close()
				_ = os.Remove(path)
				return nil, false, err
			}
			return f, true, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, false, err
		}
	}
	return nil, false, err
}

// modeBits are the set-id and sticky bits of mode as fs.FileMode bits.
func modeBits(mode uint32) fs.FileMode {
	var m fs.FileMode
	if mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// fsExitCode is the exit status of a failed operation.
func fsExitCode(err error) int {
	var fe *fsError
	if errors.As(err, &fe) {
		return fe.code
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.ENOENT:
			return agentproto.FSExitNotFound
		case syscall.EEXIST, syscall.ENOTEMPTY:
			return agentproto.FSExitExists
		case syscall.EACCES, syscall.EPERM:
			return agentproto.FSExitDenied
		case syscall.ENOTDIR:
			return agentproto.FSExitNotDir
		case syscall.EISDIR:
			return agentproto.FSExitIsDir
		}
	}
	return agentproto.FSExitFailed
}

// fsMessage says what failed: the path(s) and the reason.
func fsMessage(err error) string {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &le):
		return le.Old + " to " + le.New + ": " + errReason(le.Err)
	case errors.As(err, &pe):
		return pe.Path + ": " + errReason(pe.Err)
	}
	return err.Error()
}

// oneLine keeps a message on one line (a path may hold a newline).
func oneLine(s string) string {
	return strings.NewReplacer("\n", `\n`, "\r", `\r`).Replace(s)
}
