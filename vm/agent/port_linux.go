package agent

import (
	"fmt"
	"os"
	"os/signal"
	"sync"

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

// portWake receives SIGIO, which the virtio_console driver sends to a
// port's owner when the host opens or closes its end and when data
// arrives (O_ASYNC). One channel for the process: a pending wake is all
// waitHost needs, so a full channel drops the rest.
var portWake = sync.OnceValue(func() <-chan os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, unix.SIGIO)
	return ch
})

// wakeOnChange asks the kernel to signal SIGIO to this process on f's
// changes (on = true) or no more (false), and returns the channel that
// receives it. SIGIO is caught before O_ASYNC is set: its default action
// ends the process.
func wakeOnChange(f *os.File, on bool) (<-chan os.Signal, error) {
	wake := portWake()
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("port wake-up: %w", err)
	}
	var opErr error
	err = rc.Control(func(fd uintptr) {
		if _, opErr = unix.FcntlInt(fd, unix.F_SETOWN, os.Getpid()); opErr != nil {
			return
		}
		var fl int
		if fl, opErr = unix.FcntlInt(fd, unix.F_GETFL, 0); opErr != nil {
			return
		}
		if on {
			fl |= unix.O_ASYNC
		} else {
			fl &^= unix.O_ASYNC
		}
		_, opErr = unix.FcntlInt(fd, unix.F_SETFL, fl)
	})
	if err == nil {
		err = opErr
	}
	if err != nil {
		return nil, fmt.Errorf("port wake-up: %w", err)
	}
	return wake, nil
}
