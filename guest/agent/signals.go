package agent

import (
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/signum"
)

// parseSignal maps an RFC 4254 signal name ("TERM"), the ones the host may
// send in "signal" requests, to a signal.
func parseSignal(name string) (syscall.Signal, bool) {
	n, ok := signum.Number(name)
	if !ok || !signum.IsRFC4254(name) {
		return 0, false
	}
	return syscall.Signal(n), true
}

// signalName returns the "exit-signal" name of sig: the signal name without
// its "SIG" prefix ("TERM", "BUS"), or its number for signals without a
// name, such as real-time signals.
func signalName(sig syscall.Signal) string {
	if name := unix.SignalName(sig); name != "" {
		return strings.TrimPrefix(name, "SIG")
	}
	return strconv.Itoa(int(sig))
}
