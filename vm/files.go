package vm

// Files of templates (and saved VMs): moved across filesystems with
// their holes, written and synced, hashed, sealed into memory.

import (
	"crypto/sha256"
	"encoding/hex"
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
// extents (SEEK_DATA/SEEK_HOLE), so that holes stay holes.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
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
	fd := int(in.Fd())
	for off := int64(0); off < st.Size(); {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole from off to the end
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(out, in, hole-data); err != nil {
			return err
		}
		off = hole
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}

// writeFileSync writes b to the new file path (0400) and syncs it.
func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o400)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fileSHA256 is the hex SHA-256 of the file at path.
func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return readerSHA256(f)
}

// readerSHA256 is the hex SHA-256 of what r yields.
func readerSHA256(r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.CopyBuffer(h, r, make([]byte, 1<<20)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
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
	fd, err := unix.MemfdCreate("vmgate-template-ram", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("template ram: memfd: %w", err)
	}
	dst := os.NewFile(uintptr(fd), "vmgate-template-ram")
	fail := func(err error) (*os.File, error) {
		dst.Close()
		return nil, fmt.Errorf("template ram: %w", err)
	}
	if err := dst.Truncate(size); err != nil {
		return fail(err)
	}
	buf := make([]byte, 1<<20)
	sfd := int(src.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return fail(err)
		}
		hole, err := unix.Seek(sfd, data, unix.SEEK_HOLE)
		if err != nil {
			return fail(err)
		}
		for p := data; p < hole; {
			n := min(int64(len(buf)), hole-p)
			if _, err := src.ReadAt(buf[:n], p); err != nil && !errors.Is(err, io.EOF) {
				return fail(err)
			}
			if _, err := dst.WriteAt(buf[:n], p); err != nil {
				return fail(err)
			}
			p += n
		}
		off = hole
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(dst.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return fail(fmt.Errorf("seal: %w", err))
	}
	return dst, nil
}
