// Package gateway is vmgated's daemon: it serves the local API (package
// wire) on a Unix socket, identifies each caller with SO_PEERCRED, asks the
// policy for a verdict, runs allowed commands in fresh disposable VMs (or a
// caller's named session VM), streams their I/O, and audits every decision
// and execution.
//
// Threat model: callers are local users and the agents they run; every
// request is untrusted and is decided by the operator's policy, which is
// trusted. The caller's identity comes from the kernel (SO_PEERCRED), never
// from the request. The daemon runs as an unprivileged user and refuses to
// run as root unless told to (--allow-root). The guest is hostile: its output
// is bounded and only ever relayed, never interpreted. The audit log is
// written only by the daemon; if it cannot be written the daemon refuses new
// requests (fails closed) rather than run unaudited.
//
// Resource bounds: a global maximum of live VMs plus per-profile maxima;
// requests beyond them wait in a bounded queue for a bounded time and then
// get an explicit "busy" error. A client that disconnects has its command
// and (one-shot) VM killed.
//
// # Front doors
//
// The local API (api.go) and the SSH front door (package sshfront, given
// the exec core through sshCore) parse requests into the same exec core
// (exec.go): admit, acquire, runExec, audit. Each maps the core's domain
// errors (errors.go) to its own terms: HTTP statuses, exit codes.
//
// Lock order: Server.mu (sessions map, counters) before session.mu; neither
// is held while a VM boots or a command runs.
package gateway
