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
// # SSH front door
//
// With Config.SSH set (vmgated serve --ssh-listen), the daemon also serves
// SSH: `ssh host 'cmd'` runs cmd as `sh -c cmd` in a fresh VM, and a
// session without a command gets an interactive login shell in a VM of its
// own, ended when the channel closes. Both go through the same path as the
// local API (admit, runExec): decision, audit, VM slots and queue, cleanup.
//
// Threat model of the front door:
//
//   - Keys are the identity. Only public-key authentication is offered (no
//     passwords, no keyboard-interactive). The operator's authorized-keys
//     file (package sshkeys) maps each key to a policy profile, which must
//     accept keys (match.ssh); the policy decides as for a local caller.
//     Whoever holds a listed private key gets its profile: there is no
//     local account behind it, and the SSH user name is only recorded.
//     The identity is read from the Permissions of the key the client
//     proved it holds, never from keys it merely offered (CVE-2024-45337).
//     Every decision and execution is audited with the key's fingerprint,
//     comment, user name and remote address.
//   - Loopback only by default. TCP addresses must be loopback unless
//     --ssh-allow-remote, a logged relaxation; a Unix socket gets the
//     gateway socket's mode and group. Nothing is forwarded: only session
//     channels, no port, agent or X11 forwarding, no subsystems (sftp).
//   - Clients pin the host key. vmgated creates an ed25519 host key (0600)
//     on first start and writes its public half beside it; clients must put
//     it in known_hosts and use StrictHostKeyChecking=yes, or a process
//     that takes the port first could collect their commands and answer
//     with forged output.
//   - Bounded: connections (SSHConfig.MaxConns), sessions per connection,
//     handshake and authentication time, idle connections; an interactive
//     shell ends after the profile's sessions.idle_timeout without traffic
//     and sessions.max_lifetime at most. Closing a channel or dropping the
//     connection kills the command and destroys its VM.
//
// Lock order: Server.mu (sessions map, counters) before session.mu; neither
// is held while a VM boots or a command runs.
package gateway
