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
	return waitHostWith(ctx, f, recheck, hangupOf)
}

// waitHostWith is waitHostEvent with its check for a host, hangup (true
// while no host is connected), as a parameter: the tests stand in for a
// host that comes while the agent waits.
//
// The checks and the waits alternate strictly: hangup runs inside
// rc.Write, which waits after each check that finds no host, and the
// wait's deadline is set by that check, after it looked. So a recheck is
// exactly the first check after a wait that ended at its deadline, and
// missed is true exactly when such a check found the host. (A deadline
// set before rc.Write can pass before rc.Write starts, which then returns
// without calling the check: the agent would count a recheck that never
// waited, and would need a second check outside the wait.)
func waitHostWith(ctx context.Context, f *os.File, recheck time.Duration, hangup func(fd uintptr) (bool, error)) (missed bool, err error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return false, fmt.Errorf("wait for host: %w", err)
	}
	if err := f.SetWriteDeadline(time.Time{}); errors.Is(err, os.ErrNoDeadline) {
		return false, fmt.Errorf("wait for host: %w", errors.ErrUnsupported)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	timedOut := false // the last wait ended at its deadline
	for {
		// No deadline until the first check has looked: rc.Write then
		// always checks before it waits.
		if err := f.SetWriteDeadline(time.Time{}); err != nil {
			return false, fmt.Errorf("wait for host: %w", err)
		}
		// ctx's AfterFunc sets a deadline in the past: if it ran before a
		// deadline set here replaced it, ctx is done by now.
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		var (
			checks   int
			checkErr error
		)
		err := rc.Write(func(fd uintptr) bool {
			checks++
			var hup bool
			if hup, checkErr = hangup(fd); checkErr != nil || !hup {
				return true
			}
			if checks == 1 {
				if checkErr = f.SetWriteDeadline(time.Now().Add(recheck)); checkErr != nil {
					checkErr = fmt.Errorf("wait for host: %w", checkErr)
					return true
				}
			}
			return ctx.Err() != nil // see above
		})
		switch {
		case ctx.Err() != nil:
			return false, ctx.Err()
		case checkErr != nil:
			return false, checkErr
		case err == nil:
			// Found by the first check after a wait that timed out: no
			// wake-up came. By a later one: a wake-up came.
			return timedOut && checks == 1, f.SetWriteDeadline(time.Time{})
		case !errors.Is(err, os.ErrDeadlineExceeded):
			return false, fmt.Errorf("wait for host: %w", err)
		}
		timedOut = true
	}
}
