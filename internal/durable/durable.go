// Package durable writes small files so that a crash, or a full disk,
// leaves either the file as it was or the whole new content, never a part
// of it: the bytes go to a temporary file beside the target, which is
// synced and then moved into place (rename, or link for a file that must
// not exist yet), and the directory is synced so that the new name
// survives a crash too. On any error the temporary file is removed; an
// error before the move leaves the target as it was, one after it (the
// directory's sync) leaves the new content in place, maybe not durable.
//
// It is for the daemon's own small files (metadata, keys, session notes),
// written whole from memory. Large files (RAM images, disks) are synced
// by their writers; Sync makes such a file, or a directory's entries,
// durable by its path.
package durable

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile makes the file at path hold data with mode perm, durably (see
// the package doc). A file at path is replaced; one that is open keeps its
// old content for its readers. perm is the file's mode exactly (set on
// the open file, not masked by the umask).
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return write(path, data, perm, false)
}

// WriteNew is WriteFile for a file that must not exist yet: it never
// replaces one. When path exists (as anything, even a dangling symlink)
// the error wraps fs.ErrExist and nothing changes.
func WriteNew(path string, data []byte, perm fs.FileMode) error {
	return write(path, data, perm, true)
}

// Sync makes the file at path durable (fsync), or, for a directory, its
// entries: the names created, renamed or removed in it.
func Sync(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := fsync(f); err != nil {
		return &fs.PathError{Op: "fsync", Path: path, Err: err}
	}
	return nil
}

// fsync is f.Sync; tests see through it which files are synced.
var fsync = (*os.File).Sync

func write(path string, data []byte, perm fs.FileMode, excl bool) error {
	if err := writeTemp(path, data, perm, excl); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// writeTemp writes data to a new temporary file beside path, syncs it and
// moves it into place, then syncs the directory.
//
// Postcondition: on error no temporary file is left.
func writeTemp(path string, data []byte, perm fs.FileMode, excl bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once the file has moved
	err = f.Chmod(perm)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = fsync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if excl {
		// link(2) fails with EEXIST where rename(2) would replace; the
		// temporary name is removed by the deferred Remove.
		err = os.Link(tmp, path)
	} else {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return err
	}
	return Sync(dir)
}
