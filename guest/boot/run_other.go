//go:build !linux

package boot

import (
	"fmt"
	"io"
	"os"
	"runtime"
)

// Run is the guest init program, which only exists on Linux. On other systems
// it prints an error and exits with status 1.
func Run() {
	fmt.Fprintf(os.Stderr, "vmgate-init: not supported on %s\n", runtime.GOOS)
	os.Exit(1)
}

// RunRoot is the init of an imported root, which only exists on Linux.
func RunRoot() { Run() }

// ConfigureNetwork configures an imported root's network, which only
// exists on Linux.
func ConfigureNetwork(io.Writer) {}
