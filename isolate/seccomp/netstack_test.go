package seccomp

import (
	"errors"
	"testing"
)

// verdict is what rs answers to syscall name with args, read from the
// rule set as libseccomp compiles it: the action of a rule whose
// conditions all hold, else the default. (Rules for one syscall never
// overlap with different actions in these sets; the BPF tests check the
// compiled filter against the same cases.)
func verdict(rs RuleSet, name string, args ...uint64) Action {
	for _, r := range rs.Lookup(name) {
		ok := true
		for _, c := range r.Conds {
			var a uint64
			if int(c.Arg) < len(args) {
				a = args[c.Arg]
			}
			switch c.Op {
			case Equal:
				ok = ok && a == c.Value
			case NotEqual:
				ok = ok && a != c.Value
			case MaskedEqual:
				ok = ok && a&c.Mask == c.Value
			}
		}
		if ok {
			return r.Action
		}
	}
	return rs.Default
}

// Clone flags as glibc's pthread_create and fork, and posix_spawn, pass
// them (x86_64 values).
const (
	testThreadFlags = 0x00000100 | 0x00000200 | 0x00000400 | 0x00000800 | cloneThread | 0x00040000 | 0x00080000 | 0x00100000 | 0x00200000
	testForkFlags   = 0x01000000 | 0x00200000 | 17 // CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
	testVforkFlags  = 0x00004000 | 0x00000100 | 17 // CLONE_VFORK | CLONE_VM | SIGCHLD
)

// TestRules_Netstack: the jail's filter of the netstack role lets it start
// (one execve), make threads and load its own second filter, and nothing
// that reaches beyond its Internet sockets.
func TestRules_Netstack(t *testing.T) {
	for _, def := range []string{"errno", "kill"} {
		rs := mustRules(t, Options{Program: "netstack", DefaultAction: def})
		deny := actEPERM
		if def == "kill" {
			deny = actKill
		}
		for _, c := range []struct {
			name string
			args []uint64
			want Action
		}{
			{"execve", nil, actAllow},
			{"execveat", nil, deny},
			{"fork", nil, deny},
			{"vfork", nil, deny},
			{"clone", []uint64{testThreadFlags}, actAllow},
			{"clone", []uint64{testForkFlags}, deny},
			{"clone", []uint64{testVforkFlags}, deny},
			{"clone", []uint64{testThreadFlags | cloneNewUser}, deny},
			{"clone3", nil, actENOSYS},
			{"socket", []uint64{afINET}, actAllow},
			{"socket", []uint64{afINET6}, actAllow},
			{"socket", []uint64{afUNIX}, deny},
			{"socket", []uint64{16}, deny}, // AF_NETLINK
			{"bind", nil, deny},
			{"ioctl", nil, deny},
			{"mount", nil, deny},
			{"ptrace", nil, deny},
			{"unshare", nil, deny},
			{"seccomp", nil, actAllow},
			{"prctl", []uint64{prSetNoNewPrivs}, actAllow},
			{"prctl", []uint64{4}, deny}, // PR_SET_DUMPABLE
			{"connect", nil, actAllow},
			{"accept4", nil, actAllow},
		} {
			if got := verdict(rs, c.name, c.args...); got != c.want {
				t.Errorf("%s: %s%#x: %v, want %v", def, c.name, c.args, got, c.want)
			}
		}
		for _, r := range rs.Rules {
			if r.Why == "" {
				t.Errorf("rule %s has no provenance", r.Syscall)
			}
		}
	}
}

// TestRules_NetstackServing: the netstack's second filter denies exec and
// every new process, lets threads start, and leaves the rest to the
// filter it is stacked on.
func TestRules_NetstackServing(t *testing.T) {
	for _, def := range []string{"", "errno", "kill"} {
		rs := mustRules(t, Options{Program: "netstack-serving", DefaultAction: def})
		deny := actEPERM
		if def == "kill" {
			deny = actKill
		}
		if rs.Default != actAllow || rs.BadArch != actKill {
			t.Errorf("%q: default %v, bad arch %v: want allow (it only narrows the filter below) and kill", def, rs.Default, rs.BadArch)
		}
		for _, c := range []struct {
			name string
			args []uint64
			want Action
		}{
			{"execve", nil, deny},
			{"execveat", nil, deny},
			{"fork", nil, deny},
			{"vfork", nil, deny},
			{"clone", []uint64{testForkFlags}, deny},
			{"clone", []uint64{testVforkFlags}, deny},
			{"clone", []uint64{17}, deny}, // SIGCHLD alone: fork
			{"clone", []uint64{testThreadFlags}, actAllow},
			{"clone3", nil, actENOSYS},
			{"read", nil, actAllow},
			{"connect", nil, actAllow},
			{"socket", []uint64{afINET}, actAllow},
			{"futex", nil, actAllow},
		} {
			if got := verdict(rs, c.name, c.args...); got != c.want {
				t.Errorf("%q: %s%#x: %v, want %v", def, c.name, c.args, got, c.want)
			}
		}
		for _, r := range rs.Rules {
			if r.Why == "" || r.Action == actAllow {
				t.Errorf("rule %+v: every rule of a default-allow filter denies, and says why", r)
			}
		}
	}
	if _, err := Rules(Options{Program: "netstack-serving", DefaultAction: "log"}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("default action log: %v, want ErrInvalidOptions", err)
	}
}
