package audit

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// file is what a Log needs from its file; tests substitute failing and
// in-memory implementations.
type file interface {
	io.Writer
	io.ReaderAt
	Sync() error
	Truncate(size int64) error
	Close() error
}

// opener opens the log file for appending and reading and returns it with
// its current size.
type opener func(path string) (file, int64, error)

// openOS creates the parent directory (0750) and opens path with O_APPEND,
// creating it 0640. The final path element must not be a symlink
// (O_NOFOLLOW on Linux), the file must be a regular file, and on Linux it
// is locked against a second writer.
func openOS(path string) (file, int64, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, 0, err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|openFlags, 0o640)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("%s: not a regular file (%v)", path, fi.Mode().Type())
	}
	if err := lockFile(f); err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// linkThenRemove moves from to to without replacing an existing to: link(2)
// fails with EEXIST where rename(2) would replace.
func linkThenRemove(from, to string) error {
	if err := os.Link(from, to); err != nil {
		return err
	}
	return os.Remove(from)
}
