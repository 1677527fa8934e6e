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
	"strings"
)

// Rotation. logrotate (or an operator) moves the file away and sends
// SIGHUP; the daemon calls Reopen, which finds a new file at the path and
// starts it with a KindRotate record whose Seq and Prev continue the chain
// of the file moved away. `vmgated audit rotate` moves the file itself
// (Reopen with moveTo). VerifyFiles checks a series of files and the links
// between them.

// statter is the part of *os.File Reopen needs to tell whether the path
// still names the open file.
type statter interface{ Stat() (os.FileInfo, error) }

// Reopen makes the log write to a new file at its path when the open file
// was moved away, or, with moveTo set, after moving it to moveTo. The new
// file's first record (KindRotate) continues the chain; with a Signer the
// old file's last record and the new file's second are checkpoints. A
// path that still names the open file is left alone (rotated false). The
// old file is synced before it is left; a path that names a file with
// data in it, not the open one, is refused.
func (l *Log) Reopen(moveTo string) (rotated bool, err error) {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false, l.err
	}
	old := l.f
	rotating := moveTo != ""
	if !rotating {
		// Moved away by logrotate, or a reload without rotation.
		same, err := samePath(old, l.path)
		if err != nil {
			return false, fmt.Errorf("audit rotate: %w", err)
		}
		rotating = !same
	}
	// The old file ends signed. (Like the rotate record, the
	// checkpoints of a rotation are not mirrored.)
	if rotating && l.signer != nil && l.sinceCP > 0 && l.checkpointLocked("before rotation") == nil {
		return false, l.err
	}
	if err := old.Sync(); err != nil {
		l.failLocked(err)
		return false, l.err
	}
	l.syncedLocked(l.size)
	if moveTo != "" {
		if err := os.Rename(l.path, moveTo); err != nil {
			return false, fmt.Errorf("audit rotate: %w", err)
		}
	}
	if same, err := samePath(old, l.path); err != nil {
		return false, fmt.Errorf("audit rotate: %w", err)
	} else if same {
		return false, nil
	}
	f, size, err := openOS(l.path)
	if err != nil {
		return false, fmt.Errorf("audit rotate: %w", err)
	}
	if size != 0 {
		f.Close()
		return false, fmt.Errorf("audit rotate: %s holds %d bytes of another file: move it away and reload again", l.path, size)
	}
	prevSeq := l.seq
	l.f, l.size, l.synced, l.tail, l.dirty = f, 0, 0, nil, false
	msg := fmt.Sprintf("continues the chain of the previous file, which ends at seq %d", prevSeq)
	if moveTo != "" {
		msg = fmt.Sprintf("continues the chain of %s, which ends at seq %d", filepath.Base(moveTo), prevSeq)
	}
	if err := l.appendLocked(&Record{Kind: KindRotate, Message: msg}); err != nil {
		return true, err
	}
	if l.signer != nil && l.checkpointLocked("after rotation") == nil {
		// The new file names the key from its start.
		return true, l.err
	}
	if err := old.Close(); err != nil {
		l.logger.Warn("audit rotate: close the previous file", "err", err)
	}
	l.logger.Info("audit log rotated", "seq", l.seq, "continues_seq", prevSeq)
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
}

// VerifyFiles verifies each file and that each continues the one before
// it: its first record is KindRotate with the Seq after, and the Prev of,
// the previous file's last record. A directory stands for the files in it
// whose names start with "audit", ordered by their first record's Seq.
// The first file may start the chain or continue one whose earlier files
// were removed (retention). It stops at the first fault and names the
// file: a broken chain in it, or a file missing before it or out of order.
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
		if i == 0 || rep.Lines == 0 {
			continue
		}
		prev := out[i-1]
		if rep.ContinuesSeq != prev.LastSeq || rep.ContinuesHead != prev.Head {
			what := "starts a new chain"
			if rep.ContinuesSeq != 0 {
				what = fmt.Sprintf("continues seq %d (head %s)", rep.ContinuesSeq, short(rep.ContinuesHead))
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

// firstSeq is the Seq of a file's first record, 0 if it has none.
func firstSeq(path string) uint64 {
	f, err := openChainFile(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadBytes('\n')
	if err != nil {
		return 0
	}
	r, err := parseLine(line[:len(line)-1])
	if err != nil {
		return 0
	}
	return r.Seq
}
