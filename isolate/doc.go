// Package isolate runs QEMU in a jail (its init is the re-exec role
// "jail-init", registered with internal/reexec).
//
// Threat model: a guest that escapes the emulator lands in the QEMU
// process. Under TCG, QEMU's own documentation says the emulator is not a
// security boundary, so the process around it must be able to do almost
// nothing: see no host files but its own, reach no network, see no other
// processes, hold no capabilities, and call only the syscalls QEMU needs.
// The jail is configured by the operator and built by vmgated, never by a
// request.
//
// Jail order (each step in jail_linux.go, in this order, all on one OS
// thread locked for the purpose — capabilities, no_new_privs and seccomp
// are per thread, and execve must come from the thread that dropped them;
// a failure aborts before QEMU runs):
//
//  1. The daemon validates the Spec (absolute paths, non-root uid inside,
//     program present) and starts a re-exec of itself in role "jail-init"
//     with new user, mount, pid, net, ipc, uts and cgroup namespaces; inside the
//     user namespace the jail runs as uid/gid 1000 mapped to the daemon's
//     own uid/gid (never uid 0), holding only the ambient capabilities the
//     set-up needs (SYS_ADMIN, SYS_CHROOT, SETPCAP). The Spec arrives as
//     JSON on inherited fd 3, never in argv; the environment is empty.
//  2. The child closes every fd except 0–2 and the ones the Spec keeps.
//  3. Mounts: the whole tree becomes private; a fresh tmpfs becomes the new
//     root; into it go read-only, nosuid, nodev binds of the QEMU binary, its
//     shared libraries, QEMU's module and firmware directories and the image
//     files, and a read-write (nosuid, nodev, noexec) bind of the VM's own
//     directory — all at their host paths, so QEMU's command line and the
//     overlay's backing-file path need no rewriting; a minimal /dev (null,
//     zero, urandom, full, and kvm only when KVM is used) by bind mounts; a
//     fresh /proc of the new pid namespace, with the entries runc masks
//     (kcore, keys, timer_list, sched_debug, acpi, scsi, …) under /dev/null
//     or an empty read-only tmpfs, and /proc/sys, /proc/sysrq-trigger,
//     /proc/irq, /proc/bus and /proc/fs read-only. pivot_root into it,
//     detach the old root, remount the new root read-only.
//  4. rlimits: address space, open files, processes, file size (SIGXFSZ
//     ignored, so a write past it fails instead of killing QEMU), no core
//     dumps.
//  5. cgroup: when the daemon has a delegated cgroup (systemd Delegate=yes)
//     the jail runs in a child cgroup of its own with memory, pids and cpu
//     limits (package isolate/cgroup). The daemon moves the child there
//     right after clone, before sending the Spec, so the child has done
//     nothing yet; steps 2–9 all run inside the group. Without a usable
//     cgroup this is logged as a relaxation, or the daemon refuses to start
//     when the policy says isolate.cgroups = "required".
//  6. Capabilities: bounding, ambient, effective, permitted and inheritable
//     sets are all emptied; securebits lock that state.
//  7. PR_SET_NO_NEW_PRIVS and the parent-death signal.
//  8. The seccomp allowlist (package isolate/seccomp) is loaded as the last
//     call before execve; QEMU then adds its own -sandbox filter (spawn=deny
//     forbids any further execve).
//  9. execve QEMU (as PID 1 of the new pid namespace).
//
// The same jail runs vmgated's netstack role (Spec.Program "netstack",
// package vm/netproc): one VM's user-space network, which parses what a
// hostile guest sends. It differs in three points, each checked by
// Validate: its seccomp allowlist is its own (a Go program's; socket only
// AF_INET/AF_INET6), its environment names the role, and it keeps the
// host's network namespace (Spec.HostNetwork, refused for any other
// program), since it dials the guest's allowed connections: the one
// relaxation, documented in docs/security.md and logged by the daemon.
package isolate
