package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

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
		hup     bool
		pollErr error
	)
	if err := rc.Control(func(fd uintptr) { hup, pollErr = hangupOf(fd) }); err != nil {
		return false, fmt.Errorf("poll port: %w", err)
	}
	return hup, pollErr
}

// hangupOf polls fd once, without waiting.
func hangupOf(fd uintptr) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("poll port: %w", err)
		}
		break
	}
	if fds[0].Revents&unix.POLLNVAL != 0 {
		return false, fmt.Errorf("poll port: %w", unix.EBADF)
	}
	return fds[0].Revents&unix.POLLHUP != 0, nil
}

// waitHostEvent waits until a host is connected to the port f, checking
// each time the port's waiters are woken and at least every recheck.
// Linux's virtio_console wakes them when the host connects (the
// VIRTIO_CONSOLE_PORT_OPEN control message) and when data arrives; a port
// is writable only while a host is connected, so Go's poller (epoll,
// edge-triggered) wakes a writer then. A restored clone's agent therefore
// answers as soon as the host connects, instead of at its next poll (a
// 30 ms sleep made the first contact after a restore wait 15 ms on
// average, docs/benchmarks.md). recheck is a safety net for a device that
// would not wake its waiters. A file that Go's poller does not handle is
// errors.ErrUnsupported: the caller then polls on a timer (waitHost).
//
// missed reports a host that a recheck found, not a wake-up: the device
// did not wake the agent when the host came, and the host waited for the
// recheck. The caller says so in the log, so that the safety net never
// hides a slow first contact.
func waitHostEvent(ctx context.Context, f *os.File, recheck time.Duration) (missed bool, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return false, fmt.Errorf("wait for host: %w", err)
	}
	if err := f.SetWriteDeadline(time.Time{}); errors.Is(err, os.ErrNoDeadline) {
		return false, fmt.Errorf("wait for host: %w", errors.ErrUnsupported)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	rechecked := false // the last wait ended at its deadline
	for {
		// Checked first: a wait whose deadline has passed returns
		// without calling the check.
		if hup, err := pollHangup(f); err != nil || !hup {
			if err == nil {
				err = f.SetWriteDeadline(time.Time{})
			}
			return rechecked && err == nil, err
		}
		if err := f.SetWriteDeadline(time.Now().Add(recheck)); err != nil {
			return false, fmt.Errorf("wait for host: %w", err)
		}
		// ctx's AfterFunc sets a deadline in the past: if it ran before
		// the deadline above replaced it, ctx is done by now.
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		var pollErr error
		err := rc.Write(func(fd uintptr) bool {
			var hup bool
			hup, pollErr = hangupOf(fd)
			return pollErr != nil || !hup
		})
		switch {
		case ctx.Err() != nil:
			return false, ctx.Err()
		case pollErr != nil:
			return false, pollErr
		case err == nil:
			return false, f.SetWriteDeadline(time.Time{})
		case !errors.Is(err, os.ErrDeadlineExceeded):
			return false, fmt.Errorf("wait for host: %w", err)
		}
		rechecked = true
	}
}
