package agent

import (
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// rfcSignals holds the signal names of RFC 4254 §6.10, which the host may
// send in "signal" requests.
var rfcSignals = map[string]syscall.Signal{
	"ABRT": syscall.SIGABRT,
	"ALRM": syscall.SIGALRM,
	"FPE":  syscall.SIGFPE,
	"HUP":  syscall.SIGHUP,
	"ILL":  syscall.SIGILL,
	"INT":  syscall.SIGINT,
	"KILL": syscall.SIGKILL,
	"PIPE": syscall.SIGPIPE,
	"QUIT": syscall.SIGQUIT,
	"SEGV": syscall.SIGSEGV,
	"TERM": syscall.SIGTERM,
	"USR1": syscall.SIGUSR1,
	"USR2": syscall.SIGUSR2,
}

// parseSignal maps an RFC 4254 signal name ("TERM") to a signal.
func parseSignal(name string) (syscall.Signal, bool) {
	sig, ok := rfcSignals[name]
	return sig, ok
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
