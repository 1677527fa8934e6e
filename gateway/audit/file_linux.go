package audit

import (
	"errors"
	"fmt"
	"os"

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
