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

// wakeOnChange is only implemented on Linux: elsewhere waitHost polls.
func wakeOnChange(*os.File, bool) (<-chan os.Signal, error) {
	return nil, fmt.Errorf("port wake-up: %w", errors.ErrUnsupported)
}
