// Command escapeprobe tries to break out of vmgate's QEMU jail and reports
// which attempts were blocked.
//
// vmgate runs QEMU inside a jail: new user, mount, pid, net, ipc and uts
// namespaces; a pivot_root into a minimal root holding only QEMU's binary
// and libraries; the kernel, initrd and base image read-only; the VM's own
// directory read-write at /vm; a minimal /dev; a fresh /proc; rlimits; no
// capabilities; no_new_privs; and a seccomp allowlist. To prove the jail
// holds, the test harness runs this static binary IN PLACE OF QEMU in the
// very same jail and asserts that every escape attempt failed.
//
// Usage:
//
//	escapeprobe [--out FILE] [--host-file P]... [--host-dir P]
//	            [--other-vm-dir P] [--host-socket P] [--host-pid N]
//	            [--writable-dir P] [--no-kvm] [--only NAME]... [--skip NAME]...
//	escapeprobe --list
//
// The paths and the pid are HOST names of things the jail must hide; the
// harness passes them, and inside a working jail they are not reachable.
// The report is JSON (to --out, else stdout) in the shape of
// [github.com/vmgate/vmgate/isolate/escapeprobe/attempts.Report]; a human
// table goes to stderr. With --out the file is rewritten after every
// attempt, so if a seccomp filter kills the probe mid-run the file still
// holds every finished attempt (the next name in the table is the one that
// was running). --only and --skip select attempts by name, so a harness can
// run each attempt in a jail of its own. The exit status is 0 whenever the
// report was written, whatever it says; judging it is the harness's job
// (see attempts.Report.Failures).
//
// Honesty rules: "blocked" is computed from the observed outcome of the
// attempt, never assumed, and every detail carries the errno text. An
// attempt that cannot be made (a flag it needs is missing) is reported as
// skipped, not as blocked.
//
// Safety rules. The probe may be run by mistake outside any jail, even as
// root, so every attempt must be harmless when it SUCCEEDS:
//
//   - Writes create a uniquely named file vmgate-escapeprobe-<pid> with
//     O_EXCL (never touching an existing file) and remove it at once;
//     scratch directories and device nodes carry the same prefix and are
//     removed too.
//   - Files under /sys and /proc/sys are opened for writing and closed
//     without writing; devices are opened read-only and closed unread
//     (except 64 bytes of the /proc/kcore ELF header).
//   - A successful mount is unmounted at once, and only ever on a fresh
//     scratch directory. Calls that would be destructive if they succeeded
//     are made in a form the kernel refuses after its permission check:
//     umount2("/", MNT_EXPIRE) (always EINVAL on the root), pivot_root on a
//     directory that is not a mount point, reboot with a wrong magic
//     number, init_module of garbage, finit_module(-1). Their EPERM means
//     blocked; any other error means the permission check passed.
//   - sethostname sets the current name again; rlimits raised are restored;
//     chroot is undone through a saved descriptor of the old root;
//     setuid, setgid, capset, iopl and setns run on a throw-away OS thread
//     that exits afterwards (those change only the calling thread).
//   - ptrace uses PTRACE_SEIZE, which has PTRACE_ATTACH's permission check
//     but does not stop the target, on a throw-away thread whose exit
//     detaches it.
//   - kill only ever sends signal 0.
//   - Namespace creation is tested with clone() in a child that then execs
//     a path that does not exist, so nothing ever runs in the new
//     namespace.
//   - Network connects leave the namespace only if it is empty (no
//     interface but lo), where nothing can leave it; otherwise no connect is
//     made and the attempt is reported as not blocked.
//   - The fork bomb is bounded at 2000 raw forks (no exec) that block on a
//     pipe whose EOF ends them; all are killed and reaped before the
//     attempt returns.
//   - The memory hog is one raw fork that touches at most 4 GiB and is
//     reaped before the attempt returns.
//   - mmap of 1 TiB uses MAP_NORESERVE and is unmapped without touching a
//     page.
package main
