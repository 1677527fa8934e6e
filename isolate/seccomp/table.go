package seccomp

import (
	"errors"
	"fmt"
)

// ErrInvalidOptions reports Options that name no known accelerator or
// default action.
var ErrInvalidOptions = errors.New("invalid seccomp options")

// Provenance labels used in Rule.Why (see DERIVATION.md).
const (
	traced    = "traced"     // seen in strace runs A/B/C of DERIVATION.md
	assumed   = "assumed"    // from documentation or source, not in our traces
	denyWhy   = "deny"       // documented denial
	kvmWhy    = "kvm"        // KVM path, from the KVM API docs; untested here (no /dev/kvm)
	enosysWhy = "enosys"     // newer syscall: ENOSYS so libc falls back to an older one
	goRuntime = "go-runtime" // the jail's Go code between Load and execve
)

// nsFlags are the clone flags that create namespaces. A clone carrying any
// of them is not allowed (CLONE_NEWTIME is only reachable through clone3
// and unshare, both denied). Same mask as Docker's default profile.
const nsFlags = cloneNewNS | cloneNewCgroup | cloneNewUTS |
	cloneNewIPC | cloneNewUser | cloneNewPID | cloneNewNet

// kvmIOCType is the ioctl "type" byte of every KVM ioctl (KVMIO, 0xAE),
// which sits in bits 8..15 of the request number.
const kvmIOCType = 0xAE

// entry is one line of the allow table: a syscall with optional
// alternative condition sets, the options that need it, and provenance.
type entry struct {
	name string
	// alts are alternative condition sets (OR); nil means unconditional.
	alts [][]Cond
	// when returns whether opts need the syscall; nil means always.
	when func(Options) bool
	why  string
}

func eq(arg uint, v uint64, name string) Cond {
	return Cond{Arg: arg, Op: Equal, Value: v, Name: name}
}

func isNet(o Options) bool { return o.Network }
func isKVM(o Options) bool { return o.Accel == "kvm" }
func isIn(o Options) bool  { return o.Incoming }

// glibcStart is what ld.so and glibc call as any dynamically linked
// program starts, QEMU and vmgated alike.
var glibcStart = []entry{
	{name: "arch_prctl", why: traced + ": ld.so sets the TLS base"},
	{name: "set_tid_address", why: traced + ": glibc start-up"},
	{name: "set_robust_list", why: traced + ": glibc start-up, every thread"},
	{name: "rseq", why: traced + ": glibc 2.35+ registers restartable sequences"},
	{name: "brk", why: traced + ": malloc"},
}

// allowTable is the allowlist. Every "traced" line was observed in the
// strace runs recorded in DERIVATION.md; the rest say where they come from.
var allowTable = append(glibcStart[:len(glibcStart):len(glibcStart)], []entry{
	// Process start: the jail's execve of QEMU, then ld.so and glibc.
	{name: "execve", why: traced + ": the jail's final exec of QEMU; QEMU's -sandbox spawn=deny forbids it afterwards"},
	{name: "prlimit64", why: traced + ": glibc/QEMU read RLIMIT_STACK, RLIMIT_NOFILE"},
	{name: "mmap", why: traced + ": libraries, guest RAM, TCG code buffer (PROT_EXEC)"},
	{name: "mprotect", why: traced + ": TCG code buffer, guard pages"},
	{name: "munmap", why: traced},
	{name: "mremap", why: assumed + ": glibc realloc of large blocks"},
	{name: "madvise", why: traced + ": MADV_DONTNEED/HUGEPAGE/MERGEABLE/DONTFORK on guest RAM"},
	{name: "access", why: traced + ": firmware and module lookup"},
	{name: "openat", why: traced + ": libraries, firmware, kernel/initrd, images, /dev/urandom, /proc/self/status, /sys/devices/system/node"},
	{name: "newfstatat", why: traced},
	{name: "statfs", why: traced + ": libselinux probes /sys/fs/selinux"},
	{name: "fstatfs", why: traced + ": memory-backend-file checks for hugetlbfs"},
	{name: "readlink", why: traced + ": /proc/self/exe to find the data dir"},
	{name: "getdents64", why: traced + ": /sys/devices/system/node, module dir"},
	{name: "fchdir", why: traced + ": glibc/libnuma directory walks"},
	{name: "getrandom", why: traced + ": glib/gnutls seeding"},
	{name: "sysinfo", why: traced + ": RAM size checks"},
	{name: "sched_getaffinity", why: traced + ": CPU count"},
	{name: "get_mempolicy", why: traced + ": libnuma probe"},
	{name: "set_mempolicy", why: traced + ": libnuma probe"},
	{name: "memfd_create", why: traced + ": QEMU probes memfd support at start"},
	{name: "ftruncate", why: traced + ": memory-backend-file sizes the template RAM file"},
	{name: "close", why: traced},
	{name: "exit", why: traced + ": thread exit"},
	{name: "exit_group", why: traced},

	// QEMU installs its own -sandbox filter (stacked on ours: a new filter
	// can only restrict further) and sets process attributes.
	{name: "seccomp", why: traced + ": QEMU -sandbox loads its filter via libseccomp (probes STRICT/GET_ACTION_AVAIL first); adding a filter can only restrict"},
	{name: "prctl", alts: [][]Cond{
		{eq(0, prSetNoNewPrivs, "PR_SET_NO_NEW_PRIVS")},
		{eq(0, prSetTimerslack, "PR_SET_TIMERSLACK")},
		{eq(0, prMCEKill, "PR_MCE_KILL")},
	}, why: traced},

	// Threads and signals.
	{name: "clone", alts: [][]Cond{
		{{Arg: 0, Op: MaskedEqual, Value: 0, Mask: nsFlags, Name: "0 (no CLONE_NEW* flag)"}},
	}, why: traced + ": pthread_create after clone3 returns ENOSYS"},
	{name: "futex", why: traced},
	{name: "gettid", why: traced},
	{name: "getpid", why: assumed + ": pthread_kill (vCPU kick) and the Go runtime's tgkill(getpid(), tid)"},
	{name: "tgkill", why: assumed + ": pthread_kill, the vCPU kick (SIG_IPI); Go runtime preemption"},
	{name: "rt_sigaction", why: traced},
	{name: "rt_sigprocmask", why: traced},
	{name: "rt_sigreturn", why: assumed + ": return from any signal handler (SIG_IPI, Go's SIGURG)"},
	{name: "sigaltstack", why: assumed + ": Go runtime signal stacks; coroutine backends"},
	{name: "signalfd4", why: traced + ": main loop receives SIGBUS/SIGALRM/SIGIO and SIGTERM"},
	{name: "clock_nanosleep", why: traced},
	{name: "nanosleep", why: goRuntime + ": usleep in the scheduler"},
	{name: "sched_yield", why: goRuntime + ": osyield"},

	// Main loop and I/O.
	{name: "eventfd2", why: traced + ": event notifiers; KVM ioeventfd/irqfd"},
	{name: "ppoll", why: traced + ": AioContext / glib main loop"},
	{name: "poll", why: traced + ": worker threads"},
	{name: "epoll_create1", why: assumed + ": QEMU switches an AioContext to epoll past 64 fds; Go netpoller"},
	{name: "epoll_ctl", why: assumed + ": as epoll_create1"},
	{name: "epoll_pwait", why: assumed + ": as epoll_create1"},
	{name: "epoll_wait", why: assumed + ": as epoll_create1"},
	{name: "pipe2", why: assumed + ": event-notifier fallback; Go runtime"},
	{name: "read", why: traced},
	{name: "write", why: traced},
	{name: "readv", when: isIn, why: traced + ": incoming migration stream (QIOChannelFile)"},
	{name: "writev", why: traced},
	{name: "pread64", why: traced + ": qcow2 and backing image"},
	{name: "pwrite64", why: traced},
	{name: "preadv", why: traced},
	{name: "pwritev", why: traced},
	{name: "lseek", why: traced + ": image size, migration fd"},
	{name: "fcntl", why: traced + ": O_NONBLOCK, F_GETFL, locks on images"},
	{name: "fdatasync", why: traced + ": guest flush of the overlay"},
	{name: "fallocate", why: traced + ": qcow2 zero ranges, discard=unmap"},
	// A VM that ran on after an outgoing migration (a fork's save of a
	// cold-booted VM) gets its disks back on cont: file-posix drops their
	// page cache with posix_fadvise, and cont fails without it.
	{name: "fadvise64", why: traced + ": incoming migration stream; cont after an outgoing one"},

	// Unix sockets: QMP, the agent chardev, -netdev stream.
	{name: "socket", alts: [][]Cond{{eq(0, afUNIX, "AF_UNIX")}}, why: traced + ": only AF_UNIX"},
	{name: "socketpair", alts: [][]Cond{{eq(0, afUNIX, "AF_UNIX")}}, why: assumed + ": glib/QEMU helpers; only AF_UNIX"},
	{name: "bind", why: traced + ": QMP and agent listening sockets"},
	{name: "listen", why: traced},
	{name: "accept4", why: traced},
	{name: "getsockname", why: traced},
	{name: "getpeername", why: traced},
	{name: "getsockopt", why: traced + ": SO_TYPE probe of the migration fd"},
	{name: "recvmsg", why: traced + ": chardev and QMP (SCM_RIGHTS for getfd)"},
	{name: "sendmsg", why: traced},
	{name: "unlink", why: traced + ": stale socket paths before bind, and at exit"},
	{name: "connect", when: isNet, why: traced + ": -netdev stream dials the host-side network socket"},
	{name: "setsockopt", when: isNet, alts: [][]Cond{
		{eq(1, solSocket, "SOL_SOCKET"), eq(2, soZerocopy, "SO_ZEROCOPY")},
		{eq(1, solTCP, "SOL_TCP"), eq(2, tcpNodelay, "TCP_NODELAY")},
	}, why: traced + ": -netdev stream socket options"},

	// KVM: every KVM ioctl has type KVMIO (0xAE). From the kernel's KVM API
	// documentation, untested here.
	{name: "ioctl", when: isKVM, alts: [][]Cond{
		{{Arg: 1, Op: MaskedEqual, Value: kvmIOCType << 8, Mask: 0xff00, Name: "KVMIO<<8 (any KVM ioctl)"}},
	}, why: kvmWhy + ": /dev/kvm, VM and vCPU fds"},
}...)

// enosysTable lists syscalls that get ENOSYS whatever the default action,
// so glibc (2.36 on Debian 12) and QEMU fall back to the older call that
// the allowlist does allow. They are newer than the allowlist's baseline.
var enosysTable = []string{
	"clone3",       // glibc pthread_create → clone (traced: QEMU's own filter also returns ENOSYS)
	"faccessat2",   // glibc faccessat with flags → faccessat
	"openat2",      // → openat
	"close_range",  // glibc closefrom → /proc/self/fd walk
	"epoll_pwait2", // → epoll_pwait
	"pidfd_open",   // no child processes in QEMU
	"pidfd_send_signal",
	"pidfd_getfd",
	"futex_waitv",
	"memfd_secret",
	"process_mrelease",
	"landlock_create_ruleset",
	"set_mempolicy_home_node",
}

// denyTable documents dangerous syscalls that are absent from the
// allowlist and so get the default action.
var denyTable = []struct{ name, why string }{
	{"execveat", "only the jail's execve is needed"},
	{"fork", "QEMU never forks (-sandbox spawn=deny too)"},
	{"vfork", "as fork"},
	{"ptrace", "debugging other processes"},
	{"process_vm_readv", "cross-process memory access"},
	{"process_vm_writev", "cross-process memory access"},
	{"mount", "filesystem changes: the jail is final"},
	{"umount2", "as mount"},
	{"pivot_root", "as mount"},
	{"chroot", "as mount"},
	{"unshare", "new namespaces are kernel attack surface (CLONE_NEWUSER)"},
	{"setns", "entering other namespaces"},
	{"bpf", "eBPF verifier attack surface"},
	{"perf_event_open", "kernel attack surface, side channels"},
	{"userfaultfd", "only postcopy migration needs it; we migrate precopy from a file fd"},
	{"keyctl", "kernel keyring is not namespaced"},
	{"add_key", "as keyctl"},
	{"request_key", "as keyctl"},
	{"kexec_load", "host kernel replacement"},
	{"kexec_file_load", "as kexec_load"},
	{"init_module", "kernel modules"},
	{"finit_module", "kernel modules"},
	{"delete_module", "kernel modules"},
	{"open_by_handle_at", "escapes bind mounts (CVE-2014-3519 style)"},
	{"name_to_handle_at", "companion of open_by_handle_at"},
	{"swapon", "host swap"},
	{"swapoff", "host swap"},
	{"reboot", "host reboot"},
	{"acct", "process accounting"},
	{"quotactl", "disk quotas"},
	{"lookup_dcookie", "kernel profiling"},
	{"iopl", "raw I/O port access"},
	{"ioperm", "raw I/O port access"},
	{"mknod", "device nodes"},
	{"mknodat", "device nodes"},
	{"personality", "not called by QEMU here; READ_IMPLIES_EXEC and ADDR_NO_RANDOMIZE weaken the process"},
}

// explicitDeny are syscalls that QEMU probes and must see fail with EPERM
// whatever the default action, so it falls back instead of being killed.
var explicitDeny = []struct{ name, why string }{
	{"io_uring_setup", traced + ": QEMU probes it for fdmon-io_uring and falls back to ppoll; io_uring is large kernel attack surface"},
	{"io_uring_enter", "as io_uring_setup"},
	{"io_uring_register", "as io_uring_setup"},
}

// Rules returns the filter for opts. It is pure: no syscalls, no libseccomp.
func Rules(opts Options) (RuleSet, error) {
	var rs RuleSet
	switch opts.Program {
	case "", "qemu":
	case "netstack":
		return netstackRules(opts)
	case "netstack-serving":
		return netstackServingRules(opts)
	default:
		return rs, fmt.Errorf("seccomp rules: program %q (want qemu, netstack or netstack-serving): %w", opts.Program, ErrInvalidOptions)
	}
	switch opts.Accel {
	case "kvm", "tcg":
	default:
		return rs, fmt.Errorf("seccomp rules: accel %q (want kvm or tcg): %w", opts.Accel, ErrInvalidOptions)
	}
	rs, err := newRuleSet(allowTable, opts)
	if err != nil {
		return rs, err
	}
	rs.Denied = append(rs.Denied,
		Rule{Syscall: "socket", Action: rs.Default, Conds: []Cond{{Arg: 0, Op: NotEqual, Value: afUNIX, Name: "AF_UNIX"}},
			Why: "AF_INET, AF_INET6, AF_NETLINK, AF_PACKET, AF_VSOCK, …: QEMU sits in an empty netns and speaks only Unix sockets"},
		Rule{Syscall: "clone", Action: rs.Default, Conds: []Cond{{Arg: 0, Op: MaskedEqual, Value: nsFlags, Mask: nsFlags, Name: "any CLONE_NEW* flag"}},
			Why: "new namespaces (shown approximately: any flag of the mask set)"},
	)
	if !opts.Network {
		rs.Denied = append(rs.Denied,
			Rule{Syscall: "connect", Action: rs.Default, Why: "no -netdev stream: QEMU only listens"},
			Rule{Syscall: "setsockopt", Action: rs.Default, Why: "only the -netdev stream socket sets options"})
	}
	if !isKVM(opts) {
		rs.Denied = append(rs.Denied, Rule{Syscall: "ioctl", Action: rs.Default,
			Why: "TCG with -nographic and -serial file: traced zero ioctls"})
	}
	sortRules(rs.Denied)

	rs.Warnings = append(rs.Warnings,
		"execve allowed: the jail's final exec of QEMU needs it; afterwards only QEMU's own -sandbox spawn=deny forbids exec",
		"mmap/mprotect unrestricted: TCG needs writable+executable code buffers",
		"openat unrestricted: confinement of paths is the jail's mount namespace, not seccomp",
	)
	if isKVM(opts) {
		rs.Warnings = append(rs.Warnings,
			"ioctl allowed for every KVM request (type 0xAE) on any fd; KVM rules are from documentation, untested on this host")
	}
	if opts.Accel == "tcg" {
		rs.Warnings = append(rs.Warnings,
			"accel=tcg: TCG is not a security boundary; a guest escape lands in QEMU under this filter")
	}
	return rs, nil
}

func defaultAction(opts Options) (Action, error) {
	switch opts.DefaultAction {
	case "", "errno":
		return actEPERM, nil
	case "kill":
		return actKill, nil
	}
	return Action{}, fmt.Errorf("seccomp rules: default action %q (want errno or kill): %w", opts.DefaultAction, ErrInvalidOptions)
}

// allowRules turns the entries of table that opts need into allow rules.
func allowRules(table []entry, opts Options) []Rule {
	var out []Rule
	for _, e := range table {
		if e.when != nil && !e.when(opts) {
			continue
		}
		if len(e.alts) == 0 {
			out = append(out, Rule{Syscall: e.name, Action: actAllow, Why: e.why})
			continue
		}
		for _, conds := range e.alts {
			out = append(out, Rule{Syscall: e.name, Action: actAllow, Conds: conds, Why: e.why})
		}
	}
	return out
}

// newRuleSet is the part of a filter that every jailed program shares:
// the default action, table's allow rules, the ENOSYS and explicit EPERM
// answers, and the documented denials of denyTable.
func newRuleSet(table []entry, opts Options) (RuleSet, error) {
	var rs RuleSet
	var err error
	if rs.Default, err = defaultAction(opts); err != nil {
		return rs, err
	}
	rs.BadArch = actKill
	rs.Rules = allowRules(table, opts)
	for _, name := range enosysTable {
		rs.Rules = append(rs.Rules, Rule{Syscall: name, Action: actENOSYS, Why: enosysWhy})
	}
	for _, d := range explicitDeny {
		rs.Rules = append(rs.Rules, Rule{Syscall: d.name, Action: actEPERM, Why: denyWhy + ": " + d.why})
	}
	sortRules(rs.Rules)
	for _, d := range denyTable {
		rs.Denied = append(rs.Denied, Rule{Syscall: d.name, Action: rs.Default, Why: d.why})
	}
	return rs, nil
}
