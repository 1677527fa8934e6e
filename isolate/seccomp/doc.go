// Package seccomp builds and installs the seccomp allowlist under which the
// jail runs QEMU (package isolate's jail order: … drop caps →
// no_new_privs → seccomp Load() as the last call → exec QEMU with
// -sandbox on,…).
//
// The package is split as gVisor's filter packages are: [Rules] is pure
// (options in, a [RuleSet] out, table- and golden-tested on every GOOS),
// and [Install] is the one effectful call (libseccomp-golang: NewFilter,
// SetBadArchAction, AddRule/AddRuleConditional, SetNoNewPrivsBit, Load).
// Builds without linux+cgo get an Install that fails with an error
// wrapping [errors.ErrUnsupported]: policy demands seccomp, so the jail
// must refuse to start QEMU unfiltered.
//
// # Threat model
//
// The guest is hostile. Under TCG (the only accelerator on the build and
// CI machines) QEMU's own documentation says it is not a security
// boundary: a guest that finds a bug in the TCG translator or a device
// model runs code inside the QEMU process. The jail (namespaces, an empty
// network namespace, pivot_root, no capabilities, no_new_privs) limits
// what that process can reach; this filter limits the kernel surface it
// can touch: no new namespaces (clone with CLONE_NEW*, unshare, setns),
// no sockets but AF_UNIX, no mount, ptrace, bpf, keyrings, io_uring,
// perf_event_open, userfaultfd, module loading, raw I/O ports, and, under
// TCG, no ioctl at all. Foreign ABIs (i386 int 0x80, x32) kill the
// process. The default action is EPERM, or killing the process
// (Options.DefaultAction "kill"); clone3 and other syscalls newer than
// the table's baseline get ENOSYS so glibc falls back to the older call.
//
// The filter cannot tell the jail's execve of QEMU from a later one, so
// execve is allowed; QEMU's own filter (-sandbox spawn=deny), which it
// stacks on ours at start-up, denies every later exec and fork. Every such
// relaxation is listed in RuleSet.Warnings and logged by Install as a
// "SECCOMP WARNING".
//
// # The netstack's filters
//
// vmgated's netstack role (vm/netproc), which parses the guest's frames,
// gets two filters. The jail loads the first, Program "netstack", before
// it execs vmgated: Internet sockets only, threads but no new processes,
// no bind, ioctl or mount, and execve for that one exec. The netstack
// loads the second itself, Program "netstack-serving", once its start-up
// is done and before it reads anything from the guest: stacked on the
// first (or, when systemd starts the netstack, on the unit's
// SystemCallFilter=), it denies execve, execveat and every new process
// (fork, vfork, clone without CLONE_THREAD; clone3 gets ENOSYS), and
// allows the rest, which the filter below it decides.
//
// # Derivation
//
// The allowlist is what QEMU 7.2 actually calls with vmgate's command line,
// observed with strace -f over a full lifecycle (cold boot with disk,
// agent socket and QMP; a template with file-backed RAM, a -netdev stream
// NIC and an outgoing migration to an fd; a restore from an inherited fd
// with -incoming defer), plus a short list of calls marked "assumed" or
// "kvm" with their source. DERIVATION.md records the runs and the numbers;
// testdata/traced-syscalls.txt is the traced set, and a test checks that
// the rule table allows all of it. Each rule's Why field says whether it
// was traced, assumed, or comes from the KVM documentation (untested here:
// no /dev/kvm). Integration tests boot the real guest under the filter with
// the kill default, so a missing syscall kills QEMU and fails the test.
package seccomp
