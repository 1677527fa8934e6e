package agent

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// pollHangup reports whether poll(2) flags f with POLLHUP, which a
// virtio-serial port does while no host is connected to its QEMU socket.
// It never reads: data readable while POLLHUP is still set is the next
// host's (see devicePort).
func pollHangup(f *os.File) (bool, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return false, fmt.Errorf("poll port: %w", err)
	}
	var (
		revents int16
		pollErr error
	)
	err = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			_, pollErr = unix.Poll(fds, 0)
			if pollErr != unix.EINTR {
				break
			}
		}
		revents = fds[0].Revents
	})
	if err == nil {
		err = pollErr
	}
	if err != nil {
		return false, fmt.Errorf("poll port: %w", err)
	}
	if revents&unix.POLLNVAL != 0 {
		return false, fmt.Errorf("poll port: %w", unix.EBADF)
	}
	return revents&unix.POLLHUP != 0, nil
}
