//go:build !linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// pollHangup is only implemented on Linux, the only guest OS.
func pollHangup(*os.File) (bool, error) {
	return false, fmt.Errorf("poll port: %w", errors.ErrUnsupported)
}

// waitHostEvent is only implemented on Linux, the only guest OS.
func waitHostEvent(context.Context, *os.File, time.Duration) (bool, error) {
	return false, fmt.Errorf("wait for host: %w", errors.ErrUnsupported)
}
