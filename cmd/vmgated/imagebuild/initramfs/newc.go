package initramfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"path"
	"strings"
)

// Entry is one member of a newc cpio archive.
//
// Name is the path inside the archive: relative, slash-separated and clean
// ("dev/console", never "/dev/console", "./dev" or "dev/../x"). Mode carries
// both the type bits and the permission bits; the supported types are
// directories (fs.ModeDir), regular files (no type bit), symbolic links
// (fs.ModeSymlink), character devices (fs.ModeDevice|fs.ModeCharDevice) and
// block devices (fs.ModeDevice). fs.ModeSetuid, fs.ModeSetgid and
// fs.ModeSticky are kept; every other mode bit is rejected.
type Entry struct {
	// Name is the member's path inside the archive.
	Name string
	// Mode is the member's type and permission bits.
	Mode fs.FileMode
	// Data is the content of a regular file; it must be empty for every
	// other type.
	Data []byte
	// Linkname is the target of a symbolic link; it must be empty for every
	// other type.
	Linkname string
	// DevMajor and DevMinor are the device number of a device node (stored in
	// the header's rdevmajor and rdevminor fields); they must be zero for
	// every other type.
	DevMajor, DevMinor uint32
}

// Unix file type and permission bits as stored in the c_mode field.
const (
	modeIFDIR  = 0o040000
	modeIFCHR  = 0o020000
	modeIFBLK  = 0o060000
	modeIFREG  = 0o100000
	modeIFLNK  = 0o120000
	modeISUID  = 0o4000
	modeISGID  = 0o2000
	modeISVTX  = 0o1000
	newcMagic  = "070701"
	headerLen  = 110
	trailerStr = "TRAILER!!!"
)

// ErrInvalidEntry is wrapped by every validation error WriteNewc returns.
var ErrInvalidEntry = errors.New("invalid cpio entry")

// WriteNewc writes entries, in the given order, as a cpio archive in the SVR4
// "newc" format (magic 070701, no checksum) followed by the TRAILER!!! record.
//
// The output depends only on entries: every member has mtime 0, uid and gid 0,
// device 0:0, and inode numbers are assigned sequentially from 1 in entry
// order. Directories get nlink 2, everything else nlink 1.
//
// Parent directories are not added implicitly: every parent of a name must
// appear earlier in entries as a directory, so the archive contains exactly
// the members the caller listed. Duplicate names are rejected. Entries are
// validated before anything is written, so an invalid list writes nothing.
// Validation errors wrap [ErrInvalidEntry].
func WriteNewc(w io.Writer, entries []Entry) error {
	modes := make([]uint32, len(entries))
	dirs := make(map[string]bool, len(entries))
	seen := make(map[string]bool, len(entries))
	for i, e := range entries {
		m, err := validate(e)
		if err != nil {
			return fmt.Errorf("entry %d (%q): %w", i, e.Name, err)
		}
		if seen[e.Name] {
			return fmt.Errorf("entry %d (%q): %w: duplicate name", i, e.Name, ErrInvalidEntry)
		}
		if parent := path.Dir(e.Name); parent != "." && !dirs[parent] {
			return fmt.Errorf("entry %d (%q): %w: parent directory %q is not an earlier directory entry", i, e.Name, ErrInvalidEntry, parent)
		}
		seen[e.Name] = true
		if e.Mode.IsDir() {
			dirs[e.Name] = true
		}
		modes[i] = m
	}

	cw := &stickyWriter{w: w}
	for i, e := range entries {
		nlink := uint32(1)
		if e.Mode.IsDir() {
			nlink = 2
		}
		data := e.Data
		if e.Mode&fs.ModeSymlink != 0 {
			data = []byte(e.Linkname)
		}
		writeMember(cw, header{
			ino:       uint32(i + 1),
			mode:      modes[i],
			nlink:     nlink,
			filesize:  uint32(len(data)),
			rdevmajor: e.DevMajor,
			rdevminor: e.DevMinor,
		}, e.Name, data)
	}
	writeMember(cw, header{nlink: 1}, trailerStr, nil)
	if cw.err != nil {
		return fmt.Errorf("write cpio archive: %w", cw.err)
	}
	return nil
}

// validate checks one entry in isolation and returns its c_mode value.
func validate(e Entry) (uint32, error) {
	if err := validName(e.Name); err != nil {
		return 0, err
	}
	if e.Mode&^(fs.ModeType|fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
		return 0, fmt.Errorf("%w: unsupported mode bits %v", ErrInvalidEntry, e.Mode)
	}
	mode := uint32(e.Mode.Perm())
	if e.Mode&fs.ModeSetuid != 0 {
		mode |= modeISUID
	}
	if e.Mode&fs.ModeSetgid != 0 {
		mode |= modeISGID
	}
	if e.Mode&fs.ModeSticky != 0 {
		mode |= modeISVTX
	}

	isDev := false
	switch t := e.Mode.Type(); t {
	case 0:
		mode |= modeIFREG
	case fs.ModeDir:
		mode |= modeIFDIR
	case fs.ModeSymlink:
		mode |= modeIFLNK
		if e.Linkname == "" {
			return 0, fmt.Errorf("%w: symlink without target", ErrInvalidEntry)
		}
		if strings.IndexByte(e.Linkname, 0) >= 0 {
			return 0, fmt.Errorf("%w: symlink target contains NUL", ErrInvalidEntry)
		}
	case fs.ModeDevice | fs.ModeCharDevice:
		mode |= modeIFCHR
		isDev = true
	case fs.ModeDevice:
		mode |= modeIFBLK
		isDev = true
	default:
		return 0, fmt.Errorf("%w: unsupported file type %v", ErrInvalidEntry, t)
	}

	if e.Mode.Type() != 0 && len(e.Data) != 0 {
		return 0, fmt.Errorf("%w: data on a non-regular entry", ErrInvalidEntry)
	}
	if e.Mode&fs.ModeSymlink == 0 && e.Linkname != "" {
		return 0, fmt.Errorf("%w: link target on a non-symlink entry", ErrInvalidEntry)
	}
	if !isDev && (e.DevMajor != 0 || e.DevMinor != 0) {
		return 0, fmt.Errorf("%w: device number on a non-device entry", ErrInvalidEntry)
	}
	size := len(e.Data)
	if e.Mode&fs.ModeSymlink != 0 {
		size = len(e.Linkname)
	}
	if uint64(size) > math.MaxUint32 {
		return 0, fmt.Errorf("%w: %d bytes exceeds the newc size limit", ErrInvalidEntry, size)
	}
	return mode, nil
}

// validName reports whether name is usable as an archive member name.
func validName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty name", ErrInvalidEntry)
	case name == trailerStr:
		return fmt.Errorf("%w: reserved name", ErrInvalidEntry)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: name contains NUL", ErrInvalidEntry)
	case path.IsAbs(name):
		return fmt.Errorf("%w: absolute name", ErrInvalidEntry)
	case path.Clean(name) != name || name == ".":
		return fmt.Errorf("%w: name is not clean", ErrInvalidEntry)
	case name == ".." || strings.HasPrefix(name, "../"):
		return fmt.Errorf("%w: name escapes the archive root", ErrInvalidEntry)
	}
	return nil
}

// header holds the newc header fields that are not always zero.
type header struct {
	ino, mode, nlink, filesize, rdevmajor, rdevminor uint32
}

// writeMember writes one header, the NUL-terminated name, the data and the
// padding that aligns the name and the data to 4 bytes.
func writeMember(cw *stickyWriter, h header, name string, data []byte) {
	fields := [...]uint32{
		h.ino,
		h.mode,
		0, // uid
		0, // gid
		h.nlink,
		0, // mtime
		h.filesize,
		0, // devmajor
		0, // devminor
		h.rdevmajor,
		h.rdevminor,
		uint32(len(name) + 1), // namesize, including the NUL
		0,                     // check
	}
	buf := make([]byte, 0, headerLen+len(name)+4)
	buf = append(buf, newcMagic...)
	for _, f := range fields {
		buf = fmt.Appendf(buf, "%08x", f)
	}
	buf = append(buf, name...)
	buf = append(buf, 0)
	buf = append(buf, make([]byte, pad4(len(buf)))...)
	cw.Write(buf)
	cw.Write(data)
	cw.Write(make([]byte, pad4(len(data))))
}

// pad4 returns the number of bytes needed to round n up to a multiple of 4.
func pad4(n int) int { return (4 - n%4) % 4 }

// stickyWriter remembers the first write error and skips every later write.
type stickyWriter struct {
	w   io.Writer
	err error
}

func (c *stickyWriter) Write(p []byte) (int, error) {
	if c.err != nil || len(p) == 0 {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	c.err = err
	return n, err
}
