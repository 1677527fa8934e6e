// Package sshfront is vmgated's SSH front door. With gateway.Config.SSH
// set (vmgated serve --ssh-listen), the daemon also serves SSH: `ssh host
// 'cmd'` runs cmd as `sh -c cmd` in a fresh VM, and a session without a
// command gets an interactive login shell in a VM of its own, ended when
// the channel closes. Both go through the daemon's exec core
// (Core.Exec), as the local API does: decision, audit, VM slots and queue,
// cleanup.
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
//   - Bounded (limits.go): anyone who reaches a listener can connect
//     without a key, so connections not yet admitted have a budget of
//     their own (Config.MaxUnauthConns) and HandshakeTimeout from accept;
//     when it is full a new one displaces the oldest of the peer holding
//     the most (a peer is a uid wherever the kernel tells it, over loopback
//     TCP too: tcpowner.go), so holding connections open keeps no key
//     holder out.
//     Authenticated connections are bounded in all (MaxConns) and per key
//     (MaxConnsPerKey): over them, sessions are refused with the reason.
//     On unix: listeners each peer uid (SO_PEERCRED; a subordinate uid
//     as its login, Config.CallerOf) is bounded as well (MaxConnsPerUID). Refusals are logged once per burst. Sessions per
//     connection and idle connections are bounded too; an interactive
//     shell ends after the profile's sessions.idle_timeout without traffic
//     and sessions.max_lifetime at most. Closing a channel or dropping the
//     connection kills the command and destroys its VM.
//
// Each session channel is a session, which takes RFC 4254's requests as
// the guest agent's session does (env, pty-req, window-change, then exec
// or shell, then signal); the command runs through Core.Exec and its
// outcome, or the refusal mapped to vm-exec's exit codes (wire), ends the
// channel as exit-status or exit-signal.
package sshfront
