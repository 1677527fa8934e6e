// Package cgroup places each jailed QEMU in its own cgroup with memory,
// pids and cpu limits.
//
// Threat model: rlimits bound a single process (address space, open files)
// and, for a non-root daemon, the number of processes of its uid. They do
// not bound resident memory across threads, CPU time, or processes when the
// daemon runs as root. A guest that escapes into QEMU, or a guest that just
// makes QEMU work hard, could otherwise starve the host. A cgroup per VM
// caps what that VM's QEMU can take, whatever it does, and the kernel
// enforces it: exceeding memory ends in the cgroup's own OOM kill (the
// VM dies, the host does not), exceeding pids makes fork/clone fail with
// EAGAIN, and cpu is throttled to a quota.
//
// Where cgroups come from: vmgated never takes a cgroup it was not given.
// It uses the cgroup it runs in when that cgroup is writable by its user —
// under systemd that is what Delegate=yes provides (the unit's cgroup is
// chowned to the service user). On the unified hierarchy (v2) the daemon
// moves itself into a leaf ("daemon") so that controllers can be enabled
// for children, creates one group per daemon (named after its state
// directory, so two daemons never touch each other's groups), and one
// child per VM. On a v1 (legacy or hybrid) host the same layout is made in
// each controller's hierarchy it can write to (typically only as root).
// Nothing else is touched.
//
// When no cgroup can be used the caller decides: the daemon's policy
// ([isolate] cgroups) either refuses to start ("required") or runs with
// rlimits only and logs that as a relaxation ("auto", the default).
//
// Layout: Detect (pure) reads /proc/self/cgroup and /proc/self/mountinfo;
// LimitWrites (pure) turns Limits into control-file writes per version; the
// Manager and Group types perform them.
package cgroup
