package seccomp

import (
	"strconv"
	"syscall"
)

// Linux x86_64 values used by the pure rule table. They are spelled out
// here rather than taken from golang.org/x/sys/unix so that Rules builds
// (and its golden test runs) on every GOOS; consts_linux_test.go checks
// them against x/sys/unix.
const (
	afUNIX  = 1  // AF_UNIX
	afINET  = 2  // AF_INET
	afINET6 = 10 // AF_INET6

	cloneThread    = 0x00010000
	cloneNewNS     = 0x00020000
	cloneNewCgroup = 0x02000000
	cloneNewUTS    = 0x04000000
	cloneNewIPC    = 0x08000000
	cloneNewUser   = 0x10000000
	cloneNewPID    = 0x20000000
	cloneNewNet    = 0x40000000

	prSetTimerslack = 29 // PR_SET_TIMERSLACK
	prMCEKill       = 33 // PR_MCE_KILL
	prSetNoNewPrivs = 38 // PR_SET_NO_NEW_PRIVS

	solSocket  = 1  // SOL_SOCKET
	solTCP     = 6  // SOL_TCP
	soZerocopy = 60 // SO_ZEROCOPY
	tcpNodelay = 1  // TCP_NODELAY

	errEPERM  = syscall.Errno(1)  // EPERM
	errENOSYS = syscall.Errno(38) // ENOSYS (Linux)
)

// errnoName names the errnos a RuleSet uses.
func errnoName(e syscall.Errno) string {
	switch e {
	case errEPERM:
		return "EPERM"
	case errENOSYS:
		return "ENOSYS"
	}
	return "errno " + strconv.Itoa(int(e))
}
