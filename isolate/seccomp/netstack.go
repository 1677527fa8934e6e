package seccomp

// netstackTable is the allowlist of vmgated's netstack role: one VM's
// user-space network (package vm/netstack), a Go program (with cgo's
// glibc start-up) that reads the guest's frames from an inherited socket,
// answers its DNS queries through the host's resolver and makes the
// outbound TCP connections its policy allows. It opens no files but the
// resolver's configuration, creates no Unix sockets (the ones it uses are
// inherited, or passed by the daemon: an end of a socket pair for each
// connection into a published port of its guest), never forks, and needs no ioctl. It execs once: the jail's
// exec of vmgated itself; once its start-up is done it loads the second
// filter, netstackServingRules, which forbids exec from then on.
var netstackTable = append(glibcStart[:len(glibcStart):len(glibcStart)], []entry{
	// Process start: the jail's execve of vmgated, ld.so, glibc, the Go
	// runtime.
	{name: "execve", why: traced + ": the jail's final exec of vmgated in its netstack role; the second filter (netstack-serving) forbids it once the netstack has started"},
	{name: "prlimit64", why: traced + ": glibc reads RLIMIT_STACK; the Go runtime raises RLIMIT_NOFILE's soft limit"},
	{name: "mmap", why: traced + ": libraries, the Go heap"},
	{name: "mprotect", why: traced + ": ld.so relocations, thread stack guards"},
	{name: "munmap", why: assumed},
	{name: "madvise", why: traced + ": the Go heap returns memory"},
	{name: "access", why: traced + ": ld.so"},
	{name: "openat", why: traced + ": shared libraries, /etc/resolv.conf, /etc/hosts (the jail's root holds nothing else)"},
	{name: "newfstatat", why: traced + ": the resolver checks /etc/resolv.conf for changes"},
	{name: "fstat", why: assumed + ": ld.so, older glibc paths"},
	{name: "pread64", why: traced + ": ld.so reads ELF headers"},
	{name: "getrandom", why: traced + ": the Go runtime's seed, DNS query ids"},
	{name: "sched_getaffinity", why: traced + ": the Go runtime's CPU count"},
	{name: "getpid", why: traced},
	{name: "gettid", why: traced},

	// The second filter, which the netstack loads itself after its
	// start-up (libseccomp: PR_SET_NO_NEW_PRIVS, then seccomp() with
	// TSYNC). A filter can only narrow what this one allows.
	{name: "seccomp", why: assumed + ": the netstack's own second filter (netstack-serving), loaded after start-up; adding a filter can only restrict"},
	{name: "prctl", alts: [][]Cond{{eq(0, prSetNoNewPrivs, "PR_SET_NO_NEW_PRIVS")}},
		why: assumed + ": libseccomp sets no_new_privs (already set by the jail) before it loads the second filter"},

	// Threads, signals, time.
	{name: "clone", alts: [][]Cond{
		{{Arg: 0, Op: MaskedEqual, Value: cloneThread, Mask: nsFlags | cloneThread, Name: "CLONE_THREAD, no CLONE_NEW* flag"}},
	}, why: traced + ": the Go runtime's threads, through glibc's pthread_create (clone3 returns ENOSYS); never a new process"},
	{name: "futex", why: traced},
	{name: "nanosleep", why: traced},
	{name: "clock_nanosleep", why: assumed},
	{name: "clock_gettime", why: assumed + ": when the vDSO is unavailable"},
	{name: "sched_yield", why: traced},
	{name: "tgkill", why: traced + ": goroutine preemption"},
	{name: "rt_sigaction", why: traced},
	{name: "rt_sigprocmask", why: traced},
	{name: "rt_sigreturn", why: traced},
	{name: "sigaltstack", why: traced},
	{name: "exit", why: assumed},
	{name: "exit_group", why: traced},

	// I/O on the inherited sockets and the outbound connections.
	{name: "read", why: traced},
	{name: "write", why: traced},
	{name: "close", why: traced},
	{name: "fcntl", why: traced + ": non-blocking mode, F_DUPFD_CLOEXEC of inherited fds"},
	{name: "eventfd2", why: traced + ": the Go runtime's netpoll wake-up"},
	{name: "epoll_create1", why: traced},
	{name: "epoll_ctl", why: traced},
	{name: "epoll_pwait", why: traced},
	{name: "socket", alts: [][]Cond{{eq(0, afINET, "AF_INET")}, {eq(0, afINET6, "AF_INET6")}},
		why: traced + ": outbound TCP and the resolver's UDP/TCP; never AF_UNIX, AF_NETLINK or AF_PACKET"},
	{name: "connect", why: traced + ": outbound connections, the resolver"},
	{name: "accept4", why: traced + ": QEMU's connection on the inherited listening socket"},
	{name: "getsockname", why: traced},
	{name: "getpeername", why: traced},
	{name: "getsockopt", why: traced + ": SO_ERROR after a non-blocking connect"},
	{name: "setsockopt", why: assumed + ": TCP_NODELAY, keep-alive, SO_BROADCAST of the resolver's UDP"},
	{name: "sendto", why: assumed + ": the resolver's UDP"},
	{name: "recvfrom", why: assumed + ": the resolver's UDP"},
	{name: "recvmsg", why: traced + ": the daemon's messages: its first carries QEMU's listening socket, each dial into the guest (a published port) its end of a socket pair (SCM_RIGHTS)"},
	{name: "shutdown", why: traced + ": half-close of proxied connections"},
}...)

// netstackRules is the netstack role's filter.
func netstackRules(opts Options) (RuleSet, error) {
	rs, err := newRuleSet(netstackTable, opts)
	if err != nil {
		return rs, err
	}
	rs.Denied = append(rs.Denied,
		Rule{Syscall: "socket", Action: rs.Default, Conds: []Cond{{Arg: 0, Op: NotEqual, Value: afINET, Name: "AF_INET"}, {Arg: 0, Op: NotEqual, Value: afINET6, Name: "AF_INET6"}},
			Why: "AF_UNIX (the daemon's socket, other VMs' sockets, abstract sockets), AF_NETLINK, AF_PACKET, …: the netstack's Unix sockets are inherited"},
		Rule{Syscall: "bind", Action: rs.Default, Why: "the netstack listens on nothing of its own"},
		Rule{Syscall: "ioctl", Action: rs.Default, Why: "no devices, no terminal"},
		Rule{Syscall: "mount", Action: rs.Default, Why: "the jail's root is final"},
		Rule{Syscall: "clone", Action: rs.Default, Conds: []Cond{{Arg: 0, Op: MaskedEqual, Value: 0, Mask: cloneThread, Name: "0 (no CLONE_THREAD)"}},
			Why: "a new process (fork, vfork, posix_spawn): the netstack never makes one"},
	)
	sortRules(rs.Denied)
	rs.Warnings = append(rs.Warnings,
		"connect unrestricted: seccomp cannot see addresses; the netstack enforces the egress policy, and the unit's IPAddressDeny= (systemd) the rest",
		"openat unrestricted: confinement of paths is the jail's mount namespace, not seccomp",
		"execve allowed: the jail's exec of vmgated needs it; the netstack's second filter (netstack-serving) forbids it once it has started",
	)
	return rs, nil
}

// netstackServingRules is the netstack's second filter, which it loads
// itself (package vm/netproc) once its start-up is done: the channel to
// the daemon open, QEMU's listening socket received, the network built;
// and before it accepts QEMU's connection and parses the first frame of
// the guest. It is stacked on the first filter (the jail's netstack
// allowlist, or the unit's SystemCallFilter= when systemd starts the
// netstack) and only narrows it, so its default is to allow: the kernel
// applies every filter and the strictest answer wins. It forbids what
// the first filter cannot, since the start needs it or systemd's groups
// hold it: exec of anything, and any new process. Threads still start.
func netstackServingRules(opts Options) (RuleSet, error) {
	deny, err := defaultAction(opts)
	if err != nil {
		return RuleSet{}, err
	}
	why := func(s string) string { return denyWhy + ": " + s }
	rs := RuleSet{Default: actAllow, BadArch: actKill, Rules: []Rule{
		{Syscall: "execve", Action: deny, Why: why("the netstack has started; a compromised one must not run another program")},
		{Syscall: "execveat", Action: deny, Why: why("as execve")},
		{Syscall: "fork", Action: deny, Why: why("no new process")},
		{Syscall: "vfork", Action: deny, Why: why("no new process")},
		{Syscall: "clone", Action: deny, Conds: []Cond{{Arg: 0, Op: MaskedEqual, Value: 0, Mask: cloneThread, Name: "0 (no CLONE_THREAD)"}},
			Why: why("a new process (fork, vfork, posix_spawn); a thread carries CLONE_THREAD, which the kernel accepts only with CLONE_SIGHAND and CLONE_VM")},
		{Syscall: "clone3", Action: actENOSYS, Why: enosysWhy + ": its flags are in memory, out of a filter's reach; glibc's pthread_create falls back to clone"},
	}}
	sortRules(rs.Rules)
	return rs, nil
}
