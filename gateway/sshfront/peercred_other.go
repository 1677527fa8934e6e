//go:build !linux

package sshfront

import (
	"errors"
	"fmt"
	"net"
)

// peerUID cannot read peer credentials here: unix: connections are
// refused, as their uid could not be bounded.
func peerUID(*net.UnixConn) (uint32, error) {
	return 0, fmt.Errorf("peer credentials: %w", errors.ErrUnsupported)
}
