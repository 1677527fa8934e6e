package transfer

import (
	"archive/tar"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Resolve says where a tree whose top is top lands for the destination
// dest, as cp does: inside dest when dest is an existing directory or ends
// in "/" (then created if missing), otherwise as dest itself, whose parent
// must exist.
func Resolve(dest, top string) (parent, name string, err error) {
	if dest == "" || strings.ContainsRune(dest, 0) {
		return "", "", errors.New("empty destination, or one holding a NUL")
	}
	if strings.HasSuffix(dest, "/") {
		if err := os.MkdirAll(dest, 0o755); err != nil {
			return "", "", fmt.Errorf("destination directory: %w", err)
		}
		return dest, top, nil
	}
	if fi, err := os.Stat(dest); err == nil && fi.IsDir() {
		return dest, top, nil
	}
	parent, name = filepath.Split(dest)
	if parent == "" {
		parent = "."
	}
	if !ValidTop(name) {
		return "", "", fmt.Errorf("destination %q: cannot be created (name it as DIR/NAME)", dest)
	}
	if fi, err := os.Stat(parent); err != nil || !fi.IsDir() {
		return "", "", fmt.Errorf("destination %q: its directory %q does not exist", dest, parent)
	}
	return parent, name, nil
}

// Extract reads a tar stream from r, applies the rules, and
// creates its tree in the directory parent under the name name. The tree
// is built in a staging directory beside it and renamed into place once
// the whole stream has passed; on any error nothing is left. An existing
// name is replaced only when both it and the tree are regular files.
func Extract(r io.Reader, parent, name string, rules Rules) (Summary, error) {
	if !ValidTop(name) {
		return Summary{}, fmt.Errorf("extract: invalid name %q", name)
	}
	root, err := os.OpenRoot(parent)
	if err != nil {
		return Summary{}, fmt.Errorf("extract: %w", err)
	}
	defer root.Close()
	staging := ".vmgate-transfer-" + rand.Text()[:12]
	if err := root.Mkdir(staging, 0o700); err != nil {
		return Summary{}, fmt.Errorf("extract: staging directory: %w", err)
	}
	defer func() { _ = root.RemoveAll(staging) }()
	sr, err := root.OpenRoot(staging)
	if err != nil {
		return Summary{}, fmt.Errorf("extract: %w", err)
	}
	defer sr.Close()

	in := sha256.New()
	c := newChecker(rules)
	top, err := extractTree(sr, tar.NewReader(io.TeeReader(r, in)), c)
	if err != nil {
		return c.sum, err
	}
	// What follows the archive's end (a writer's padding) is part of the
	// stream.
	if _, err := io.Copy(in, r); err != nil {
		return c.sum, fmt.Errorf("read tar stream: %w", err)
	}
	c.sum.SHA256 = hex.EncodeToString(in.Sum(nil))
	if err := place(root, path.Join(staging, c.top), name, top); err != nil {
		return c.sum, err
	}
	return c.sum, nil
}

// extractTree creates the checked entries of tr beneath root and returns
// the type of the top entry; c.sum gets FileSHA256. Symlinks are created
// last, once the whole tree has passed: no file or directory is ever
// created through one, and none exists before its resolution is checked.
func extractTree(root *os.Root, tr *tar.Reader, c *checker) (byte, error) {
	var topType byte
	var fh fileHash
	var links []*tar.Header
	for {
		h, typ, err := c.next(tr)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, err
		}
		if topType == 0 {
			topType = typ
		}
		name := strings.TrimSuffix(h.Name, "/")
		switch typ {
		case tar.TypeDir:
			fh.entry(typ)
			err = root.Mkdir(name, fileMode(h)|0o700)
		case tar.TypeSymlink:
			fh.entry(typ)
			links = append(links, h)
		case tar.TypeReg:
			err = writeFile(root, name, h, io.TeeReader(tr, fh.entry(typ)))
		}
		if err != nil {
			return 0, fmt.Errorf("extract %q: %w", name, err)
		}
	}
	if c.top == "" {
		return 0, errors.New("empty tar stream: nothing to copy")
	}
	if err := c.checkLinks(); err != nil {
		return 0, err
	}
	for _, h := range links {
		name := strings.TrimSuffix(h.Name, "/")
		if err := root.Symlink(h.Linkname, name); err != nil {
			return 0, fmt.Errorf("extract %q: %w", name, err)
		}
	}
	c.sum.FileSHA256 = fh.sum()
	return topType, nil
}

func writeFile(root *os.Root, name string, h *tar.Header, content io.Reader) error {
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode(h))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, content); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if !h.ModTime.IsZero() {
		_ = root.Chtimes(name, h.ModTime, h.ModTime)
	}
	return nil
}

// place renames the finished tree from into name, both in root. Only a
// regular file replaces an existing regular file; anything else that
// exists is left alone and reported.
func place(root *os.Root, from, name string, typ byte) error {
	fi, err := root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("destination %q: %w", name, err)
	case fi.Mode().IsRegular() && typ == tar.TypeReg:
	default:
		kind := "a directory"
		if !fi.IsDir() {
			kind = "not a regular file"
		}
		return fmt.Errorf("destination %q exists and is %s: remove it or name another destination: %w", name, kind, fs.ErrExist)
	}
	if err := root.Rename(from, name); err != nil {
		return fmt.Errorf("put %q in place: %w", name, err)
	}
	return nil
}

// Pack writes the tree at src (a file or a directory; a symlink at src
// itself is followed, symlinks beneath it are copied as links) as a tar
// stream to w, under the rules. Its top is src's base name.
func Pack(w io.Writer, src string, rules Rules) (Summary, error) {
	return pack(w, src, rules, true)
}

// Measure applies Pack's walk and rules to src without reading any file:
// the entries and bytes a Pack would send now.
func Measure(src string, rules Rules) (Summary, error) {
	return pack(io.Discard, src, rules, false)
}

func pack(w io.Writer, src string, rules Rules, contents bool) (Summary, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return Summary{}, fmt.Errorf("pack %q: %w", src, err)
	}
	top := filepath.Base(abs)
	if !ValidTop(top) {
		return Summary{}, fmt.Errorf("pack %q: cannot copy the root directory; name a directory beneath it", src)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return Summary{}, fmt.Errorf("pack: %w", err)
	}
	out := sha256.New()
	var tw *tar.Writer
	if contents {
		tw = tar.NewWriter(io.MultiWriter(w, out))
	}
	c := newChecker(rules)
	var fh fileHash
	err = filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(real, p)
		name := top
		if rel != "." {
			name = top + "/" + filepath.ToSlash(rel)
		}
		return packEntry(tw, p, name, d, c, &fh)
	})
	if err == nil {
		err = c.checkLinks()
	}
	if err != nil {
		return c.sum, fmt.Errorf("pack %q: %w", src, err)
	}
	if tw == nil {
		return c.sum, nil
	}
	if err := tw.Close(); err != nil {
		return c.sum, fmt.Errorf("pack %q: %w", src, err)
	}
	c.sum.SHA256 = hex.EncodeToString(out.Sum(nil))
	c.sum.FileSHA256 = fh.sum()
	return c.sum, nil
}

// packEntry checks the entry at p, named name in the stream, and writes
// it to tw unless tw is nil (Measure).
func packEntry(tw *tar.Writer, p, name string, d fs.DirEntry, c *checker, fh *fileHash) error {
	h := &tar.Header{Name: name, Format: tar.FormatPAX}
	var f *os.File
	switch t := d.Type(); {
	case t.IsDir():
		h.Typeflag = tar.TypeDir
	case t&fs.ModeSymlink != 0:
		link, err := os.Readlink(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Linkname = tar.TypeSymlink, link
	case t.IsRegular():
		h.Typeflag = tar.TypeReg
		if tw != nil {
			var err error
			if f, err = openSame(p, d); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			defer f.Close()
		}
	default:
		return fmt.Errorf("%s: not a regular file, directory or symlink (%s): not copied", name, t)
	}
	fi, err := statOf(f, d)
	if err != nil {
		return err
	}
	h.Mode, h.ModTime = int64(fi.Mode().Perm()), fi.ModTime()
	if h.Typeflag == tar.TypeReg {
		h.Size = fi.Size()
	}
	typ, err := c.check(h)
	if err != nil || tw == nil {
		return err
	}
	if err := tw.WriteHeader(header(h, typ)); err != nil {
		return err
	}
	cw := fh.entry(typ)
	if f == nil {
		return nil
	}
	// The size is the open file's: one that shrinks meanwhile is an error,
	// one that grows is cut at it.
	if _, err := io.CopyN(io.MultiWriter(tw, cw), f, h.Size); err != nil {
		return fmt.Errorf("%s: changed while it was copied: %w", name, err)
	}
	return nil
}

// errChanged is wrapped by the errors of openSame.
var errChanged = errors.New("changed while it was copied")

// openSame opens the regular file the walk found at p, and refuses one
// replaced since: by a symlink (not followed), a FIFO or a device (the
// open does not block on it, and its type is checked), or another file
// (the open file's device and inode are not those of the walk's lstat).
func openSame(p string, d fs.DirEntry) (*os.File, error) {
	walked, err := d.Info() // an lstat, for an entry beneath the top
	if err != nil {
		return nil, err
	}
	if !walked.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: now %s", errChanged, walked.Mode().Type())
	}
	f, err := openNoFollow(p)
	if err != nil {
		return nil, err
	}
	opened, err := f.Stat()
	switch {
	case err != nil:
	case !opened.Mode().IsRegular():
		err = fmt.Errorf("%w: opened %s", errChanged, opened.Mode().Type())
	case !os.SameFile(walked, opened):
		err = fmt.Errorf("%w: replaced by another file", errChanged)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

func statOf(f *os.File, d fs.DirEntry) (fs.FileInfo, error) {
	if f != nil {
		return f.Stat()
	}
	return d.Info()
}
