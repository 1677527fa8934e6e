package audit

import (
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Rotation. logrotate (or an operator) moves the file away and sends
// SIGHUP; the daemon calls Reopen, which finds a new file at the path and
// starts it with a KindRotate record whose Seq and Prev continue the chain
// of the file moved away, and whose Predecessor names that file (where
// the open descriptor says it now is). `vmgated audit rotate` moves the
// file itself (Rotate). No rotation ever replaces a file: a name that is
// taken is refused (rename with RENAME_NOREPLACE), and Rotate picks a free
// one. VerifyFiles checks a series of files and the links between them.

// statter is the part of *os.File Reopen needs to tell whether the path
// still names the open file.
type statter interface{ Stat() (os.FileInfo, error) }

// RotateStamp is the layout of the time in the names Rotate gives.
const RotateStamp = "20060102T150405Z"

// maxRotateNames bounds the names Rotate tries for one second.
const maxRotateNames = 1000

// Reopen makes the log write to a new file at its path when the open file
// was moved away, or, with moveTo set, after moving it to moveTo. The new
// file's first record (KindRotate) continues the chain; with a Signer the
// old file's last record and the new file's second are checkpoints. A
// path that still names the open file is left alone (rotated false). The
// old file is synced before it is left; a path that names a file with
// data in it, not the open one, is refused. A moveTo that exists is
// refused (an error wrapping os.ErrExist) and the log goes on in the open
// file.
func (l *Log) Reopen(moveTo string) (rotated bool, err error) {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	rotating := moveTo != ""
	if !rotating && l.err == nil {
		// Moved away by logrotate, or a reload without rotation.
		same, err := samePath(l.f, l.path)
		if err != nil {
			return false, fmt.Errorf("audit rotate: %w", err)
		}
		rotating = !same
	}
	if err := l.leaveLocked(rotating); err != nil {
		return false, err
	}
	if moveTo != "" {
		if err := renameNoReplace(l.path, moveTo); err != nil {
			return false, fmt.Errorf("audit rotate: %w", err)
		}
	}
	return l.continueLocked(moveTo)
}

// Rotate moves the log to PATH.TIME (TIME in UTC, [RotateStamp]), or to
// PATH.TIME.1, PATH.TIME.2, … when that name is taken, never replacing a
// file, and continues the chain in a new file at PATH, as Reopen does. It
// returns the name it moved the log to.
func (l *Log) Rotate() (movedTo string, err error) {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.leaveLocked(true); err != nil {
		return "", err
	}
	base := l.path + "." + l.now().UTC().Format(RotateStamp)
	for i := 0; ; i++ {
		if i == maxRotateNames {
			return "", fmt.Errorf("audit rotate: %s and %d more names are taken", base, maxRotateNames-1)
		}
		movedTo = base
		if i > 0 {
			movedTo += "." + strconv.Itoa(i)
		}
		err = renameNoReplace(l.path, movedTo)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("audit rotate: %w", err)
		}
	}
	if _, err := l.continueLocked(movedTo); err != nil {
		return movedTo, err
	}
	return movedTo, nil
}

// leaveLocked readies the open file to be left: it must be healthy, and
// is synced; when it is rotated away, with a Signer, it ends signed (like
// the rotate record, the checkpoints of a rotation are not mirrored).
func (l *Log) leaveLocked(rotating bool) error {
	if l.err != nil {
		return l.err
	}
	if rotating && l.signer != nil && l.sinceCP > 0 && l.checkpointLocked("before rotation") == nil {
		return l.err
	}
	if err := l.f.Sync(); err != nil {
		l.failLocked(err)
		return l.err
	}
	l.syncedLocked(l.size)
	return nil
}

// continueLocked opens a new file at the path, unless the path still
// names the open file, and starts it with the KindRotate record that
// continues the chain of the open file, which movedTo names ("": where
// its descriptor says it is).
func (l *Log) continueLocked(movedTo string) (rotated bool, err error) {
	old := l.f
	if same, err := samePath(old, l.path); err != nil {
		return false, fmt.Errorf("audit rotate: %w", err)
	} else if same {
		return false, nil
	}
	if movedTo == "" {
		movedTo = currentName(old)
	}
	f, size, err := openOS(l.path)
	if err != nil {
		return false, fmt.Errorf("audit rotate: %w", err)
	}
	if size != 0 {
		f.Close()
		return false, fmt.Errorf("audit rotate: %s holds %d bytes of another file: move it away and reload again", l.path, size)
	}
	pred := &Predecessor{LastSeq: l.seq, Head: l.head}
	if movedTo != "" {
		pred.File = filepath.Base(movedTo)
	}
	l.f, l.size, l.synced, l.tail, l.dirty = f, 0, 0, nil, false
	msg := fmt.Sprintf("continues the chain of the previous file, which ends at seq %d", pred.LastSeq)
	if pred.File != "" {
		msg = fmt.Sprintf("continues the chain of %s, which ends at seq %d", pred.File, pred.LastSeq)
	}
	if err := l.appendLocked(&Record{Kind: KindRotate, Message: msg, Predecessor: pred}); err != nil {
		return true, err
	}
	if l.signer != nil && l.checkpointLocked("after rotation") == nil {
		// The new file names the key from its start.
		return true, l.err
	}
	if err := old.Close(); err != nil {
		l.logger.Warn("audit rotate: close the previous file", "err", err)
	}
	l.logger.Info("audit log rotated", "seq", l.seq, "continues_seq", pred.LastSeq, "continues", pred.File)
	return true, nil
}

// samePath reports whether path names the open file f.
func samePath(f file, path string) (bool, error) {
	st, ok := f.(statter)
	if !ok {
		return false, nil
	}
	cur, err := st.Stat()
	if err != nil {
		return false, err
	}
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return os.SameFile(cur, fi), nil
}

// openChainFile opens a log file, decompressing a .gz one (logrotate's
// compress).
func openChainFile(path string) (io.ReadCloser, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(path, ".gz") {
		return f, nil
	}
	z, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{z, f}, nil
}

// FileReport is one file of VerifyFiles.
type FileReport struct {
	Path string
	Report
	// PredecessorMissing is set on the first file of the series when
	// it continues a file that its rotate record names (Predecessor.File)
	// and no file of that name (or with ".gz" added) is in the series or
	// beside it: removed by retention, or erased.
	PredecessorMissing bool
}

// VerifyFiles verifies each file and that each continues the one before
// it: its first record is KindRotate with the Seq after, and the Prev of,
// the previous file's last record. A directory stands for the files in it
// whose names start with "audit", ordered by their first record's Seq.
// The first file may start the chain or continue one whose earlier files
// were removed (retention); when its rotate record names that file and it
// is not there, its report says so (PredecessorMissing), and this is not
// an error: retention removes the oldest file, and only the operator
// knows which files it should have kept. It stops at the first fault and
// names the file: a broken chain in it, or a file missing before it (named
// when its successor's rotate record names it) or out of order.
func VerifyFiles(paths ...string) ([]FileReport, error) {
	return VerifyFilesWith(VerifyOptions{}, paths...)
}

// ErrNoCheckpoint: files verified against pinned keys hold no checkpoint.
var ErrNoCheckpoint = errors.New("no signed checkpoint")

// VerifyFilesWith is VerifyFiles with o's checks (VerifyWith) on each
// file; with o.Keys the files must hold at least one checkpoint, or the
// error wraps ErrNoCheckpoint (and ErrCheckpoint).
func VerifyFilesWith(o VerifyOptions, paths ...string) ([]FileReport, error) {
	files, err := expand(paths)
	if err != nil {
		return nil, err
	}
	var out []FileReport
	for i, p := range files {
		rep, err := verifyPath(p, o)
		out = append(out, FileReport{Path: p, Report: rep})
		if err != nil {
			return out, fmt.Errorf("audit verify %s: %w", p, err)
		}
		if i == 0 {
			out[0].PredecessorMissing = predecessorMissing(p, rep.Predecessor, files)
			continue
		}
		if rep.Lines == 0 {
			continue
		}
		prev := out[i-1]
		if rep.ContinuesSeq != prev.LastSeq || rep.ContinuesHead != prev.Head {
			what := "starts a new chain"
			if rep.ContinuesSeq != 0 {
				what = fmt.Sprintf("continues seq %d (head %s)", rep.ContinuesSeq, short(rep.ContinuesHead))
			}
			if pr := rep.Predecessor; pr != nil && pr.File != "" {
				what += " of " + pr.File
			}
			return out, fmt.Errorf("audit verify %s: %w: it %s, but %s ends at seq %d (head %s): a file is missing between them, they are out of order, or %s was changed",
				p, ErrChainBroken, what, prev.Path, prev.LastSeq, short(prev.Head), prev.Path)
		}
	}
	if len(o.Keys) > 0 && !slices.ContainsFunc(out, func(r FileReport) bool { return r.Checkpoints > 0 }) {
		return out, fmt.Errorf("audit verify: %w: %w by %s in %d file(s): they were not written by a daemon with this key, or were rewritten by someone without it",
			ErrCheckpoint, ErrNoCheckpoint, fingerprints(o.Keys), len(out))
	}
	return out, nil
}

// predecessorMissing reports whether pred names a file that is neither
// among files nor beside path (path itself excepted: a file deleted while
// open leaves its name to the next).
func predecessorMissing(path string, pred *Predecessor, files []string) bool {
	if pred == nil || pred.File == "" || strings.ContainsAny(pred.File, "/\x00") || pred.File == "." || pred.File == ".." {
		return false
	}
	self, err := os.Stat(path)
	if err != nil {
		return false
	}
	for _, name := range []string{pred.File, pred.File + ".gz"} {
		for _, f := range files {
			if filepath.Base(f) == name && f != path {
				return false
			}
		}
		fi, err := os.Stat(filepath.Join(filepath.Dir(path), name))
		if err == nil && fi.Mode().IsRegular() && !os.SameFile(fi, self) {
			return false
		}
	}
	return true
}

func verifyPath(p string, o VerifyOptions) (Report, error) {
	f, err := openChainFile(p)
	if err != nil {
		return Report{Head: GenesisPrev}, err
	}
	defer f.Close()
	return VerifyWith(f, o)
}

// expand replaces each directory in paths by its audit files in chain order.
func expand(paths []string) ([]string, error) {
	var out []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("audit verify: %w", err)
		}
		if !fi.IsDir() {
			out = append(out, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, fmt.Errorf("audit verify: %w", err)
		}
		type seqFile struct {
			path string
			seq  uint64
		}
		var fs []seqFile
		for _, e := range ents {
			if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), "audit") {
				continue
			}
			fp := filepath.Join(p, e.Name())
			fs = append(fs, seqFile{fp, firstSeq(fp)})
		}
		sort.Slice(fs, func(i, j int) bool { return fs[i].seq < fs[j].seq })
		for _, f := range fs {
			out = append(out, f.path)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("audit verify: no files")
	}
	return out, nil
}

// firstSeq is the Seq of a file's first record, 0 if it has none or it
// cannot be read (VerifyWith then names the fault). Its first line is
// read as VerifyWith reads every line, at most MaxLineSize after
// decompression: a .gz file of 191 KiB unpacked to a first line without
// end, which an unbounded read held whole (438 MiB allocated).
func firstSeq(path string) uint64 {
	f, err := openChainFile(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	line, err := readLine(bufio.NewReaderSize(f, 64<<10))
	if err != nil {
		return 0
	}
	r, err := parseLine(line[:len(line)-1])
	if err != nil {
		return 0
	}
	return r.Seq
}
