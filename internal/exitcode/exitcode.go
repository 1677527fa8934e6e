// Package exitcode lists the exit codes vmgate's commands use for their own
// failures, distinct from the guest command's codes (0–128+signal), so a
// caller can tell "the command failed" from "vmgate could not run it".
package exitcode

// Exit codes of vm-exec and vmgated debug run.
const (
	// Internal: vmgate itself failed (bad flags, I/O error).
	Internal = 200
	// Denied: the policy refused the request.
	Denied = 201
	// Busy: no VM slot became free in time.
	Busy = 202
	// TimedOut: the command ran past its time limit and was killed.
	TimedOut = 203
	// Unreachable: the gateway socket could not be reached.
	Unreachable = 204
	// VMFailed: the VM could not be started or died while running.
	VMFailed = 205
	// Usage: the command line was invalid.
	Usage = 2
)
