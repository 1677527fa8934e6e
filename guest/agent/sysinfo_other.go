//go:build !linux

package agent

import (
	"errors"
	"time"
)

// setSystemClock is only implemented on Linux, the only guest OS.
func setSystemClock(time.Time) error {
	return errors.ErrUnsupported
}

func reseedKernel([]byte) error { return errors.ErrUnsupported }

// randomDevice is only implemented on Linux, the only guest OS.
type randomDevice struct{}

func openRandomDevice() (*randomDevice, error) { return nil, errors.ErrUnsupported }
func (*randomDevice) close()                   {}
func (*randomDevice) reseed([]byte) error      { return errors.ErrUnsupported }

// kernelRelease is only implemented on Linux, the only guest OS.
func kernelRelease() string { return "" }
