//go:build !linux

package agent

import (
	"errors"
	"fmt"
	"os"
)

// pollHangup is only implemented on Linux, the only guest OS.
func pollHangup(*os.File) (bool, error) {
	return false, fmt.Errorf("poll port: %w", errors.ErrUnsupported)
}
