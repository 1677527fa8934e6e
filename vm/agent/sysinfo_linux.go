package agent

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// setSystemClock sets CLOCK_REALTIME to t.
func setSystemClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

// kernelRelease returns the running kernel's release (uname -r), or "" if
// it cannot be determined.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}
