package vm

// Files of templates (and saved VMs): moved across filesystems with
// their holes, sealed into memory. Their sums are package integrity's. Metadata files are written by
// package durable.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// moveFile renames src to dst or, when they are on two filesystems (a
// template directory on another disk than the state directory), copies
// src with its holes (a template's RAM file is mostly holes) and removes
// it.
func moveFile(src, dst string) error {
	err := os.Rename(src, dst)
	if !errors.Is(err, unix.EXDEV) {
		return err
	}
	if err := copySparse(src, dst); err != nil {
		_ = os.Remove(dst)
		return fmt.Errorf("move %s to another filesystem: %w", filepath.Base(src), err)
	}
	return os.Remove(src)
}

// copySparse copies src to the new file dst, writing only src's data
// extents (SEEK_DATA/SEEK_HOLE), so that holes stay holes. src may be a
// VM's (openQEMUFile).
func copySparse(src, dst string) error {
	in, err := openQEMUFile(src, os.O_RDONLY)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := out.Truncate(st.Size()); err != nil {
		return err
	}
	err = dataExtents(in, func(off, n int64) error {
		if _, err := in.Seek(off, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(off, io.SeekStart); err != nil {
			return err
		}
		_, err := io.CopyN(out, in, n)
		return err
	})
	if err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}

// openQEMUFile opens a file that a VM's QEMU can write or replace: one in
// the VM's directory, read-write in its jail, or moved or linked out of
// it. A QEMU that a guest took over can put a symlink there to any path
// of the host, which the daemon would follow with its own rights (copy a
// file of its own into a save point or an error message, change its
// mode), or a FIFO, whose open would wait for a writer. So the file is
// opened without following a symlink (O_NOFOLLOW) or waiting
// (O_NONBLOCK, which a regular file ignores), and must be a regular file;
// its mode is changed on the open file (chmodQEMUFile), never by path.
func openQEMUFile(path string, flag int) (*os.File, error) {
	f, err := os.OpenFile(path, flag|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s: not a regular file (%v)", path, st.Mode().Type())
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// chmodQEMUFile sets the mode of a file that a VM's QEMU can write or
// replace (openQEMUFile) on the open file.
func chmodQEMUFile(path string, mode os.FileMode) error {
	f, err := openQEMUFile(path, os.O_RDONLY)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Chmod(mode)
}

// allocatedBytes is the space a (sparse) file takes.
func allocatedBytes(path string) int64 {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0
	}
	return st.Blocks * 512
}

// sealedCopy copies the file at path (size bytes, holes skipped) into a new
// memfd and seals it against any write, resize or further sealing.
func sealedCopy(path string, size int64) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("template ram: %w", err)
	}
	defer src.Close()
	if st, err := src.Stat(); err != nil || st.Size() != size {
		return nil, fmt.Errorf("template ram: %s is not %d bytes (%v)", path, size, err)
	}
	dst, err := memFile("vmgate-template-ram", size)
	if err != nil {
		return nil, fmt.Errorf("template ram: %w", err)
	}
	fail := func(err error) (*os.File, error) {
		dst.Close()
		return nil, fmt.Errorf("template ram: %w", err)
	}
	buf := make([]byte, 1<<20)
	err = dataExtents(src, func(off, n int64) error {
		for end := off + n; off < end; {
			k := min(int64(len(buf)), end-off)
			if _, err := src.ReadAt(buf[:k], off); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			if _, err := dst.WriteAt(buf[:k], off); err != nil {
				return err
			}
			off += k
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if err := seal(dst); err != nil {
		return fail(err)
	}
	return dst, nil
}

// memFile is a new memory file (memfd) of size bytes, all zeros, that
// can be sealed.
func memFile(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// writeBehind writes to a file and starts the write-back of each write at
// once (sync_file_range), so that the disk works while the writer goes
// on, and a final Sync has little left to wait for.
type writeBehind struct{ f *os.File }

func (w writeBehind) WriteAt(p []byte, off int64) (int, error) {
	n, err := w.f.WriteAt(p, off)
	if n > 0 {
		_ = unix.SyncFileRange(int(w.f.Fd()), off, int64(n), unix.SYNC_FILE_RANGE_WRITE)
	}
	return n, err
}

// dupFile is a new descriptor of f's open file.
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// seal makes a memory file unchangeable: no write, no change of size, no
// new seal. VMs map it private copy-on-write.
func seal(f *os.File) error {
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return fmt.Errorf("seal: %w", err)
	}
	return nil
}

// dataExtents calls fn for each data extent of f (offset, length), in
// order, as SEEK_DATA and SEEK_HOLE find them.
func dataExtents(f *os.File, fn func(off, n int64) error) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	fd := int(f.Fd())
	for off := int64(0); off < st.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		if err := fn(data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}
