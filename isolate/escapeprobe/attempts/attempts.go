// Package attempts describes the escape attempts made by the escapeprobe
// binary and decodes the report it writes.
//
// The escapeprobe binary is run in place of QEMU inside vmgate's jail; each
// attempt tries one way out of the jail and records whether it was blocked.
// This package holds only data: the table of attempt names and their one-line
// descriptions, and the Result and Report types of the probe's JSON output.
// It makes no system calls, so tests anywhere in the module can import it to
// decode and judge a report without risk.
//
// Reading a report: a Result with Control set is a positive control that
// must NOT be blocked (for example writing into the VM's own directory); a
// blocked control means the probe could not do what QEMU legitimately needs,
// so the other results prove nothing. A Result with Skipped set was not
// attempted (a flag it needs was not given); its Blocked is false. An
// attempt marked Informational in the table may be allowed by a correct
// jail; its result documents behaviour and [Report.Failures] does not count
// it.
package attempts

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Result is the outcome of one attempt.
type Result struct {
	// Name is the attempt's name, one of [Names].
	Name string `json:"name"`
	// Blocked reports that the attempt failed, as observed (never assumed).
	// For a control it must be false.
	Blocked bool `json:"blocked"`
	// Control marks a positive control, which a working jail allows.
	Control bool `json:"control,omitempty"`
	// Skipped marks an attempt that was not made, for example because the
	// host path or pid it targets was not given. Blocked is then false.
	Skipped bool `json:"skipped,omitempty"`
	// Detail says what was tried and what happened, with the errno text.
	Detail string `json:"detail"`
}

// Report is the probe's whole output.
type Report struct {
	Results []Result `json:"results"`
}

// Info describes one attempt in the table.
type Info struct {
	// Name is the stable identifier used in reports.
	Name string
	// Doc is a one-line description of what is tried and when it counts
	// as blocked.
	Doc string
	// Control marks a positive control that a working jail must allow.
	Control bool
	// Informational marks an attempt that a correct jail may allow; the
	// result documents behaviour rather than judging the jail.
	Informational bool
}

var table = []Info{
	{Name: "read-etc-shadow", Doc: "open and read /etc/shadow; blocked if that fails"},
	{Name: "read-etc-passwd", Doc: "open and read /etc/passwd; blocked if that fails"},
	{Name: "read-host-files", Doc: "read each --host-file; blocked only if every read fails"},
	{Name: "list-host-dir", Doc: "list --host-dir; blocked if that fails"},
	{Name: "write-host-dir", Doc: "create and remove vmgate-escapeprobe-<pid> in --host-dir; blocked if the create fails"},
	{Name: "stat-other-vm-dir", Doc: "stat --other-vm-dir (another VM's directory); blocked if it cannot be seen"},
	{Name: "list-other-vm-dir", Doc: "list --other-vm-dir and read its first regular file; blocked if neither works"},
	{Name: "write-other-vm-dir", Doc: "create and remove vmgate-escapeprobe-<pid> in --other-vm-dir; blocked if the create fails"},
	{Name: "read-proc1-environ", Doc: "read /proc/1/environ; blocked if PID 1 is the probe itself or the read fails"},
	{Name: "count-processes", Doc: "count /proc entries; blocked if few are visible and /proc/<--host-pid> is not"},
	{Name: "proc-host-root", Doc: "list /proc/<--host-pid>/root, the host's root through the proc magic link; blocked if that fails"},
	{Name: "kill-host-pid", Doc: "kill(--host-pid, 0) (signal 0 only); blocked on any error (ESRCH/EPERM)"},
	{Name: "kill-parent", Doc: "kill(getppid(), 0); blocked if the parent is outside our pid namespace (ppid 0) or the call fails"},
	{Name: "ptrace-host-pid", Doc: "PTRACE_ATTACH to --host-pid (detached at once on success); blocked if the attach fails"},
	{Name: "ptrace-parent", Doc: "PTRACE_ATTACH to getppid() (detached at once on success); blocked if ppid is 0 or the attach fails"},
	{Name: "ptrace-pid-1", Doc: "PTRACE_ATTACH to pid 1 (detached at once on success); blocked if the attach fails"},
	{Name: "mount-tmpfs", Doc: "mount a tmpfs on a fresh scratch directory (unmounted at once on success); blocked if the mount fails"},
	{Name: "umount-root", Doc: "umount2(\"/\", MNT_EXPIRE), which has no effect even when allowed: EPERM means blocked, EINVAL means the capability check passed"},
	{Name: "unshare-user", Doc: "clone(CLONE_NEWUSER) in a child that then execs a missing path; blocked if the clone fails"},
	{Name: "unshare-mount", Doc: "clone(CLONE_NEWNS) in a child that then execs a missing path; blocked if the clone fails"},
	{Name: "setns-host-mnt", Doc: "open /proc/<--host-pid>/ns/mnt and setns to it; blocked if the open fails"},
	{Name: "setns-host-net", Doc: "open /proc/<--host-pid>/ns/net and setns a throw-away thread into it; blocked if either fails"},
	{Name: "chroot-dotdot", Doc: "chroot(\"..\") (the root is restored on success); blocked if it fails"},
	{Name: "chroot-escape", Doc: "classic escape: mkdir, chroot into it, chdir(\"..\") 64 times, chroot(\".\"), read /etc/shadow (root restored); blocked if /etc/shadow stays unreadable"},
	{Name: "pivot-root", Doc: "pivot_root on a fresh non-mount-point directory, which has no effect even when allowed: EPERM means blocked"},
	{Name: "exec-bin-sh", Doc: "fork and execve /bin/sh -c 'exit 0'; blocked if the execve fails (ENOENT when the jail root has no shell)"},
	{Name: "exec-self", Doc: "fork and execve /proc/self/exe in a mode that exits at once; the jail's seccomp filter may allow execve", Informational: true},
	{Name: "socket-inet", Doc: "socket(AF_INET); if it succeeds in an empty netns, connect 127.0.0.1:22 and 1.1.1.1:53; blocked if the socket or both connects fail"},
	{Name: "socket-inet6", Doc: "socket(AF_INET6); if it succeeds in an empty netns, connect [::1]:22 and [2606:4700:4700::1111]:53; blocked if the socket or both connects fail"},
	{Name: "socket-netlink", Doc: "socket(AF_NETLINK, NETLINK_ROUTE); blocked if it fails or the namespace it sees has no interface but lo"},
	{Name: "socket-packet", Doc: "socket(AF_PACKET, SOCK_RAW); blocked if it fails or the namespace it sees has no interface but lo"},
	{Name: "socket-vsock", Doc: "socket(AF_VSOCK) (vsock is not namespaced); blocked if it fails"},
	{Name: "connect-host-socket", Doc: "connect to the Unix socket --host-socket; blocked on ENOENT/EACCES/ECONNREFUSED/EPERM/ENOTDIR"},
	{Name: "connect-abstract-unix", Doc: "connect to up to 3 abstract Unix sockets listed in /proc/net/unix; blocked if none is visible or every connect fails"},
	{Name: "mknod-char-device", Doc: "mknod a copy of /dev/null (c 1 3) in the writable dir and open it (removed after); blocked if either fails"},
	{Name: "open-dev-mem", Doc: "open /dev/mem read-only (closed unread); blocked if that fails"},
	{Name: "open-dev-kmsg", Doc: "open /dev/kmsg read-only (closed unread); blocked if that fails"},
	{Name: "open-dev-sda", Doc: "open /dev/sda read-only (closed unread); blocked if that fails"},
	{Name: "open-dev-vda", Doc: "open /dev/vda read-only (closed unread); blocked if that fails"},
	{Name: "open-dev-kvm", Doc: "with --no-kvm, open /dev/kvm; blocked if that fails (skipped without --no-kvm)"},
	{Name: "write-etc", Doc: "create and remove vmgate-escapeprobe-<pid> in /etc; blocked if the create fails"},
	{Name: "write-root", Doc: "create and remove vmgate-escapeprobe-<pid> in /; blocked if the create fails or / is the --writable-dir"},
	{Name: "write-tmp", Doc: "create and remove vmgate-escapeprobe-<pid> in /tmp; blocked if the create fails or /tmp is the --writable-dir"},
	{Name: "write-own-vm-dir", Doc: "positive control: create, write and remove vmgate-escapeprobe-<pid> in --writable-dir; must succeed", Control: true},
	{Name: "read-dev-urandom", Doc: "positive control: read 16 bytes from /dev/urandom, which the jail provides; must succeed", Control: true},
	{Name: "rlimit-nofile-raise", Doc: "prlimit RLIMIT_NOFILE above its hard limit (restored on success); blocked if that fails"},
	{Name: "rlimit-nproc-raise", Doc: "prlimit RLIMIT_NPROC above its hard limit (restored on success); blocked if that fails; not blocked if it is unlimited"},
	{Name: "setuid-0", Doc: "setuid(0) on a throw-away thread; blocked if it fails, or if already uid 0 with CapEff 0"},
	{Name: "setgid-0", Doc: "setgid(0) on a throw-away thread; blocked if it fails, or if already gid 0 with CapEff 0"},
	{Name: "capset-regain", Doc: "capset every capability into the effective and permitted sets on a throw-away thread; blocked if that fails"},
	{Name: "capeff-zero", Doc: "read CapEff/CapPrm/CapAmb from /proc/self/status; blocked if all are zero"},
	{Name: "no-new-privs", Doc: "gain privilege through a set-id exec; blocked if /proc/self/status says NoNewPrivs: 1"},
	{Name: "memory-hog", Doc: "a child touches up to 4 GiB of anonymous memory, 64 MiB at a time; blocked if a limit (the jail's memory cgroup, or RLIMIT_AS) stops it first"},
	{Name: "fork-bomb", Doc: "fork (without exec) up to 2000 sleeping copies of the probe (all killed after); blocked if a limit stops it below 2000"},
	{Name: "mmap-1tib", Doc: "mmap 1 TiB PROT_READ|PROT_WRITE MAP_NORESERVE without touching it (unmapped at once); blocked if RLIMIT_AS makes it fail"},
	{Name: "io-uring-setup", Doc: "io_uring_setup(1, ...) (closed on success); blocked if it fails"},
	{Name: "bpf-prog-load", Doc: "BPF_PROG_LOAD of a two-instruction socket filter (closed on success); blocked if it fails"},
	{Name: "add-key", Doc: "add_key a user key to the process keyring (invalidated on success); blocked if it fails"},
	{Name: "userfaultfd", Doc: "userfaultfd(), then with UFFD_USER_MODE_ONLY (closed on success); blocked if both fail"},
	{Name: "perf-event-open", Doc: "perf_event_open of a user-only software counter on ourselves (closed on success); blocked if it fails"},
	{Name: "init-module", Doc: "init_module of 64 zero bytes, which no kernel loads: EPERM means blocked, any other error means the capability check passed"},
	{Name: "finit-module", Doc: "finit_module(-1): EPERM means blocked, EBADF means the capability check passed"},
	{Name: "reboot", Doc: "reboot() with a wrong magic number, which never reboots: EPERM means blocked, EINVAL means CAP_SYS_BOOT is held"},
	{Name: "iopl", Doc: "iopl(3) on a throw-away thread (reset to 0 on success); blocked if it fails"},
	{Name: "sethostname", Doc: "sethostname to its current value (no change); blocked if it fails, or contained if --host-pid's UTS namespace is hidden or different"},
	{Name: "write-sys-kernel", Doc: "open a file under /sys/kernel for writing, writing nothing; blocked if that fails or none is visible"},
	{Name: "write-proc-core-pattern", Doc: "open /proc/sys/kernel/core_pattern for writing, writing nothing; blocked if that fails"},
	{Name: "write-proc-sysrq-trigger", Doc: "open /proc/sysrq-trigger for writing, writing nothing; blocked if that fails"},
	{Name: "read-proc-kcore", Doc: "open /proc/kcore and read its first bytes; blocked if that fails"},
	{Name: "open-by-handle-at", Doc: "open_by_handle_at on a handle of / (the 'shocker' escape); blocked on EPERM"},
}

// All returns a copy of the attempt table, in the order the probe runs it.
func All() []Info {
	return append([]Info(nil), table...)
}

// Names returns every attempt name, in the order the probe runs them.
func Names() []string {
	out := make([]string, len(table))
	for i, a := range table {
		out[i] = a.Name
	}
	return out
}

// Lookup returns the table entry for name.
func Lookup(name string) (Info, bool) {
	for _, a := range table {
		if a.Name == name {
			return a, true
		}
	}
	return Info{}, false
}

// Decode reads a report written by the probe. It rejects unknown fields
// and results without a name.
func Decode(r io.Reader) (Report, error) {
	var rep Report
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		return Report{}, fmt.Errorf("decode escapeprobe report: %w", err)
	}
	for i, res := range rep.Results {
		if res.Name == "" {
			return Report{}, fmt.Errorf("decode escapeprobe report: result %d has no name", i)
		}
	}
	return rep, nil
}

// Get returns the result named name.
func (r Report) Get(name string) (Result, bool) {
	for _, res := range r.Results {
		if res.Name == name {
			return res, true
		}
	}
	return Result{}, false
}

// Failures returns the results that show the jail did not hold: a control
// that was blocked, or a non-informational attempt that was made and not
// blocked. Skipped results are not failures; see [Report.Skipped].
func (r Report) Failures() []Result {
	var out []Result
	for _, res := range r.Results {
		if res.Skipped {
			continue
		}
		if res.Control {
			if res.Blocked {
				out = append(out, res)
			}
			continue
		}
		if info, ok := Lookup(res.Name); ok && info.Informational {
			continue
		}
		if !res.Blocked {
			out = append(out, res)
		}
	}
	return out
}

// Skipped returns the results of attempts that were not made.
func (r Report) Skipped() []Result {
	var out []Result
	for _, res := range r.Results {
		if res.Skipped {
			out = append(out, res)
		}
	}
	return out
}

// Table renders r as a human-readable table, one attempt per line:
// name, verdict, and detail.
func Table(r Report) string {
	width := len("attempt")
	for _, res := range r.Results {
		width = max(width, len(res.Name))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-*s  %-12s  %s\n", width, "attempt", "verdict", "detail")
	for _, res := range r.Results {
		fmt.Fprintf(&b, "%-*s  %-12s  %s\n", width, res.Name, Verdict(res), res.Detail)
	}
	return b.String()
}

// Verdict is the one-word summary of res used by [Table].
func Verdict(res Result) string {
	switch {
	case res.Skipped:
		return "skipped"
	case res.Control && !res.Blocked:
		return "control-ok"
	case res.Control:
		return "CONTROL-FAIL"
	case res.Blocked:
		return "blocked"
	default:
		return "NOT-BLOCKED"
	}
}

// Sorted returns the names in r sorted, for comparisons in tests.
func (r Report) Sorted() []string {
	out := make([]string, len(r.Results))
	for i, res := range r.Results {
		out[i] = res.Name
	}
	sort.Strings(out)
	return out
}
