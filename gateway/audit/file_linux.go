package audit

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const openFlags = unix.O_NOFOLLOW

// errLocked is returned by lockFile when another process holds the lock.
var errLocked = errors.New("locked by another process (is another vmgated running?)")

// lockFile takes a non-blocking exclusive flock(2) on f, held until f is
// closed, so that two daemons cannot interleave their chains in one file.
func lockFile(f *os.File) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) {
		for {
			lerr = unix.Flock(int(fd), unix.LOCK_EX|unix.LOCK_NB)
			if !errors.Is(lerr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	if errors.Is(lerr, unix.EWOULDBLOCK) {
		return fmt.Errorf("%s: %w", f.Name(), errLocked)
	}
	if lerr != nil {
		return os.NewSyscallError("flock", lerr)
	}
	return nil
}

// renameNoReplace renames from to to unless to exists (an error wrapping
// os.ErrExist): renameat2(RENAME_NOREPLACE), atomic. On a file system
// without it (EINVAL) it links and then unlinks, which refuses an
// existing name as well.
func renameNoReplace(from, to string) error {
	for {
		err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
			return linkThenRemove(from, to)
		}
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
}

// currentName is where the open file f is now (logrotate moved it), or ""
// when that is unknown. A deleted file keeps the name it had.
func currentName(f file) string {
	osf, ok := f.(*os.File)
	if !ok {
		return ""
	}
	rc, err := osf.SyscallConn()
	if err != nil {
		return ""
	}
	var name string
	_ = rc.Control(func(fd uintptr) {
		n, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(fd)))
		if err != nil {
			return
		}
		var st unix.Stat_t
		if unix.Fstat(int(fd), &st) == nil && st.Nlink == 0 {
			n = strings.TrimSuffix(n, " (deleted)")
		}
		name = n
	})
	return name
}
