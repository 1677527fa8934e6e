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
// # The parts
//
//   - The way in (lease.go): every request of any kind (a command, an
//     operation on a session, a publication) holds a lease while it is in
//     flight; a shutdown refuses new ones, gives the ones held the grace
//     period, then ends their contexts.
//   - The exec core (exec.go): a command goes admit (a lease, the policy's
//     decision, audited) → its VM (a fresh one from vm.Host, or its
//     session's) → runExec (the command, with the front door's streams) →
//     its outcome (outcome.go), audited, with its receipt (receipts.go).
//   - The recorder (recorder.go): every audit record, through the flood
//     gates (floodgate.go) for what a caller or a guest can make at will;
//     one function turns any request's decision into its record.
//   - The sessions (sessions.go and session_*.go): the table of every
//     caller's sessions, each a typed state (running, paused, ended) with
//     its persisted record (session_store.go), the lost notes, the reaper,
//     pause and resume (session_pause.go), forks (session_fork.go), network
//     locks (netlock.go) and published ports (publish.go, forward.go). They
//     reach the rest through the narrow sessionCore interface.
//
// A session is a VM kept for one caller across commands. Paused, it is a
// save point on disk (package vm: its RAM, device state and disk) and holds
// no VM and no slot; its next command resumes it. A fork copies a session's
// state into new sessions, each restored from one save point of it (a
// running session is saved at that moment into a fork point the copies
// share). Paused sessions outlive the daemon; running ones are paused when
// it stops, and lost if it dies.
//
// # Front doors
//
// The local API (api.go) and the SSH front door (package sshfront, given
// the exec core through sshCore) parse requests into the same exec core
// and its sessions. Each maps the core's domain errors (errors.go) to its
// own terms: HTTP statuses, exit codes.
//
// Lock order: sessions.mu (the table) before session.mu; neither is held
// while a VM boots or a command runs.
package gateway
