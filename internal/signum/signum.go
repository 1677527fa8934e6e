// Package signum holds the Linux signal numbers under the names vmgate's
// protocols use: RFC 4254 §6.10 style, without "SIG" ("TERM", "XCPU"). It
// is the one table for the guest agent, the host's exec, the client and
// the tool wrappers, so that a command killed by signal N ends with 128+N
// whichever way it was run.
//
// The numbers are Linux's (the guest's), not the host's: the client may
// run on another system, the guest is always Linux on x86-64, whose
// numbering every common Linux architecture shares.
package signum

import "strings"

// byName maps every standard Linux signal to its number.
var byName = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "BUS": 7, "FPE": 8,
	"KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15,
	"STKFLT": 16, "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22,
	"URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29,
	"PWR": 30, "SYS": 31,
}

// RFC4254 lists the signal names RFC 4254 §6.10 defines: the ones a "signal"
// request may carry to a running command.
var RFC4254 = []string{"ABRT", "ALRM", "FPE", "HUP", "ILL", "INT", "KILL", "PIPE", "QUIT", "SEGV", "TERM", "USR1", "USR2"}

// Number returns the signal's number; name may carry a "SIG" prefix.
func Number(name string) (int, bool) {
	n, ok := byName[strings.TrimPrefix(name, "SIG")]
	return n, ok
}

// Name returns the name of signal n ("TERM"), or "" for a number without
// one (real-time signals).
func Name(n int) string {
	for name, m := range byName {
		if m == n {
			return name
		}
	}
	return ""
}

// ExitCode is the shell's exit code of a command killed by the named
// signal: 128+N, or 128 when the name is unknown.
func ExitCode(name string) int {
	n, _ := Number(name)
	return 128 + n
}

// IsRFC4254 reports whether name is one of RFC4254.
func IsRFC4254(name string) bool {
	for _, s := range RFC4254 {
		if s == name {
			return true
		}
	}
	return false
}
