package signum

import (
	"runtime"
	"syscall"
	"testing"
)

func TestTable(t *testing.T) {
	for _, c := range []struct {
		name string
		n    int
		exit int
	}{
		{"TERM", 15, 143}, {"SIGTERM", 15, 143}, {"KILL", 9, 137}, {"XCPU", 24, 152}, {"XFSZ", 25, 153},
		{"SYS", 31, 159}, {"BOGUS", 0, 128}, {"", 0, 128},
	} {
		n, ok := Number(c.name)
		if n != c.n || ok != (c.n != 0) || ExitCode(c.name) != c.exit {
			t.Errorf("%q: number %d %v, exit %d; want %d, %d", c.name, n, ok, ExitCode(c.name), c.n, c.exit)
		}
	}
	if Name(24) != "XCPU" || Name(64) != "" {
		t.Errorf("Name: %q %q", Name(24), Name(64))
	}
	if !IsRFC4254("TERM") || IsRFC4254("XCPU") || IsRFC4254("SIGTERM") {
		t.Error("IsRFC4254")
	}
	for _, s := range RFC4254 {
		if _, ok := Number(s); !ok {
			t.Errorf("RFC 4254 name %s has no number", s)
		}
	}
}

// TestMatchesLinux: on a Linux x86-64 or arm64 host the table is the
// kernel's own.
func TestMatchesLinux(t *testing.T) {
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		t.Skip("not the guest's numbering")
	}
	for name, sig := range map[string]syscall.Signal{
		"HUP": syscall.SIGHUP, "TRAP": syscall.SIGTRAP, "BUS": syscall.SIGBUS, "USR1": syscall.SIGUSR1,
		"CHLD": syscall.SIGCHLD, "STOP": syscall.SIGSTOP, "XCPU": syscall.SIGXCPU, "XFSZ": syscall.SIGXFSZ,
		"WINCH": syscall.SIGWINCH, "PWR": syscall.SIGPWR, "SYS": syscall.SIGSYS,
	} {
		if n, _ := Number(name); n != int(sig) {
			t.Errorf("%s: %d, the kernel says %d", name, n, sig)
		}
	}
	if len(byName) != 31 {
		t.Errorf("%d signals, want the 31 standard ones", len(byName))
	}
}
