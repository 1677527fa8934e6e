package agent

import (
	"fmt"
	"os"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// openPty allocates a pseudo-terminal. The master is returned in
// non-blocking mode, served by the runtime poller, so that deadlines can
// interrupt reads and writes on it; pty.Open leaves it in blocking mode.
func openPty() (ptmx, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	ptmx, err = pollable(m)
	if err != nil {
		_ = tty.Close()
		return nil, nil, err
	}
	return ptmx, tty, nil
}

// pollable replaces f by a non-blocking duplicate registered with the
// runtime poller and closes f.
func pollable(f *os.File) (*os.File, error) {
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("make %s pollable: %w", f.Name(), err)
	}
	var (
		fd     int
		dupErr error
	)
	if err := rc.Control(func(old uintptr) {
		fd, dupErr = unix.FcntlInt(old, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, fmt.Errorf("make %s pollable: %w", f.Name(), err)
	}
	if dupErr != nil {
		return nil, fmt.Errorf("make %s pollable: dup: %w", f.Name(), dupErr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("make %s pollable: %w", f.Name(), err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// setWinsize sets the terminal size of a pty from RFC 4254 dimensions,
// clamped to the kernel's 16-bit fields. Unlike pty.Setsize it does not put
// the file into blocking mode.
func setWinsize(ptmx *os.File, cols, rows, width, height uint32) error {
	ws := &unix.Winsize{Col: clamp16(cols), Row: clamp16(rows), Xpixel: clamp16(width), Ypixel: clamp16(height)}
	rc, err := ptmx.SyscallConn()
	if err != nil {
		return fmt.Errorf("set pty size: %w", err)
	}
	var ioctlErr error
	if err := rc.Control(func(fd uintptr) {
		ioctlErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws)
	}); err != nil {
		return fmt.Errorf("set pty size: %w", err)
	}
	if ioctlErr != nil {
		return fmt.Errorf("set pty size: %w", ioctlErr)
	}
	return nil
}

func clamp16(v uint32) uint16 {
	return uint16(min(v, 0xffff))
}
