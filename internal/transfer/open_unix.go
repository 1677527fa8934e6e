//go:build unix

package transfer

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// openNoFollow opens p for reading without following a symlink at p and
// without blocking on a FIFO or a device.
func openNoFollow(p string) (*os.File, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("%w: now a symlink", errChanged)
	}
	return f, err
}
