// Package contrib holds no code: it is where the files an operator installs
// live (systemd units, sysusers.d and tmpfiles.d entries, the AppArmor
// profile, example policies, Nomad and Kubernetes examples, install.sh).
//
// Its tests check those files with the tools that will read them:
// systemd-analyze verify and security on the units (the exposure score is
// recorded in docs/operator.md), the units' system call filter and
// namespace list against what the jail and QEMU need (isolate/,
// isolate/seccomp), and systemd-sysusers and systemd-tmpfiles on the
// sysusers.d and tmpfiles.d files in a scratch root.
package contrib
