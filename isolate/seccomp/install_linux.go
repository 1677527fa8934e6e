//go:build linux && cgo

package seccomp

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// fallbackNr numbers the ENOSYS-table syscalls that an older libseccomp
// may not know by name. The filter is built for the native architecture
// only, so the host's numbers are the right ones.
var fallbackNr = map[string]int{
	"clone3":                  unix.SYS_CLONE3,
	"faccessat2":              unix.SYS_FACCESSAT2,
	"openat2":                 unix.SYS_OPENAT2,
	"close_range":             unix.SYS_CLOSE_RANGE,
	"epoll_pwait2":            unix.SYS_EPOLL_PWAIT2,
	"pidfd_open":              unix.SYS_PIDFD_OPEN,
	"pidfd_send_signal":       unix.SYS_PIDFD_SEND_SIGNAL,
	"pidfd_getfd":             unix.SYS_PIDFD_GETFD,
	"futex_waitv":             unix.SYS_FUTEX_WAITV,
	"memfd_secret":            unix.SYS_MEMFD_SECRET,
	"process_mrelease":        unix.SYS_PROCESS_MRELEASE,
	"landlock_create_ruleset": unix.SYS_LANDLOCK_CREATE_RULESET,
	"set_mempolicy_home_node": unix.SYS_SET_MEMPOLICY_HOME_NODE,
}

// Install loads the filter for opts into the calling process (all threads,
// via TSYNC), after setting no_new_privs. Every relaxation in the rule set
// is logged first as a "SECCOMP WARNING". A nil log means slog.Default().
//
// Precondition: this is the jail's last step before unix.Exec of QEMU or
// of vmgated's netstack; the rest of the jail (namespaces, mounts,
// credentials, capabilities) is already in place. Or, with Program
// "netstack-serving", the netstack is done with its start-up and has
// not yet read a byte from the guest.
// Postcondition: on success the filter cannot be removed; the process may
// only run what Rules(opts) allows (and what every filter loaded before
// allows), including one execve unless the program is
// "netstack-serving".
func Install(opts Options, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	rs, err := Rules(opts)
	if err != nil {
		return fmt.Errorf("seccomp install: %w", err)
	}
	f, err := build(rs)
	if err != nil {
		return fmt.Errorf("seccomp install: %w", err)
	}
	defer f.Release()
	for _, w := range rs.Warnings {
		log.Warn("SECCOMP WARNING: "+w, "accel", opts.Accel, "network", opts.Network, "incoming", opts.Incoming)
	}
	log.Info("seccomp filter loading", "allowed_syscalls", len(rs.Names()), "default", rs.Default.String())
	if err := f.Load(); err != nil {
		return fmt.Errorf("seccomp load: %w", err)
	}
	return nil
}

// ExportBPF writes the compiled classic-BPF program for opts to w, in the
// kernel's struct sock_filter layout (8 bytes per instruction, host byte
// order). Tests run it in a BPF VM.
func ExportBPF(opts Options, w io.Writer) error {
	rs, err := Rules(opts)
	if err != nil {
		return fmt.Errorf("seccomp export: %w", err)
	}
	f, err := build(rs)
	if err != nil {
		return fmt.Errorf("seccomp export: %w", err)
	}
	defer f.Release()
	fd, err := unix.MemfdCreate("vmgate-seccomp-bpf", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("seccomp export: %w", os.NewSyscallError("memfd_create", err))
	}
	mf := os.NewFile(uintptr(fd), "vmgate-seccomp-bpf")
	defer mf.Close()
	if err := f.ExportBPF(mf); err != nil {
		return fmt.Errorf("seccomp export: %w", err)
	}
	if _, err := mf.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("seccomp export: %w", err)
	}
	if _, err := io.Copy(w, mf); err != nil {
		return fmt.Errorf("seccomp export: %w", err)
	}
	return nil
}

// build turns rs into a libseccomp filter. The caller releases it.
func build(rs RuleSet) (*libseccomp.ScmpFilter, error) {
	def, err := scmpAction(rs.Default)
	if err != nil {
		return nil, err
	}
	f, err := libseccomp.NewFilter(def)
	if err != nil {
		return nil, fmt.Errorf("new filter: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Release()
		}
	}()
	badArch, err := scmpAction(rs.BadArch)
	if err != nil {
		return nil, err
	}
	if err := f.SetBadArchAction(badArch); err != nil {
		return nil, fmt.Errorf("set bad-arch action: %w", err)
	}
	if err := f.SetNoNewPrivsBit(true); err != nil {
		return nil, fmt.Errorf("set no_new_privs: %w", err)
	}
	for _, r := range rs.Rules {
		if r.Action == rs.Default {
			// libseccomp rejects a rule whose action is the default;
			// the default already does what the rule says.
			continue
		}
		nr, err := syscallNr(r.Syscall)
		if err != nil {
			return nil, err
		}
		act, err := scmpAction(r.Action)
		if err != nil {
			return nil, err
		}
		if len(r.Conds) == 0 {
			if err := f.AddRule(nr, act); err != nil {
				return nil, fmt.Errorf("add rule %s: %w", r.Syscall, err)
			}
			continue
		}
		conds := make([]libseccomp.ScmpCondition, 0, len(r.Conds))
		for _, c := range r.Conds {
			sc, err := scmpCond(c)
			if err != nil {
				return nil, fmt.Errorf("rule %s: %w", r.Syscall, err)
			}
			conds = append(conds, sc)
		}
		if err := f.AddRuleConditional(nr, act, conds); err != nil {
			return nil, fmt.Errorf("add rule %s if %s: %w", r.Syscall, condString(r.Conds), err)
		}
	}
	ok = true
	return f, nil
}

func syscallNr(name string) (libseccomp.ScmpSyscall, error) {
	nr, err := libseccomp.GetSyscallFromName(name)
	if err == nil {
		return nr, nil
	}
	if n, ok := fallbackNr[name]; ok {
		return libseccomp.ScmpSyscall(n), nil
	}
	return 0, fmt.Errorf("syscall %s: %w", name, err)
}

func scmpAction(a Action) (libseccomp.ScmpAction, error) {
	switch a.Kind {
	case Allow:
		return libseccomp.ActAllow, nil
	case Errno:
		return libseccomp.ActErrno.SetReturnCode(int16(a.Errno)), nil
	case KillProcess:
		return libseccomp.ActKillProcess, nil
	}
	return 0, fmt.Errorf("action %v: %w", a, ErrInvalidOptions)
}

func scmpCond(c Cond) (libseccomp.ScmpCondition, error) {
	var (
		sc  libseccomp.ScmpCondition
		err error
	)
	switch c.Op {
	case Equal:
		sc, err = libseccomp.MakeCondition(c.Arg, libseccomp.CompareEqual, c.Value)
	case NotEqual:
		sc, err = libseccomp.MakeCondition(c.Arg, libseccomp.CompareNotEqual, c.Value)
	case MaskedEqual:
		// libseccomp: mask first, datum second (SCMP_CMP_MASKED_EQ).
		sc, err = libseccomp.MakeCondition(c.Arg, libseccomp.CompareMaskedEqual, c.Mask, c.Value)
	default:
		return sc, fmt.Errorf("condition %v: unknown op: %w", c, ErrInvalidOptions)
	}
	if err != nil {
		return sc, fmt.Errorf("condition %v: %w", c, err)
	}
	return sc, nil
}
