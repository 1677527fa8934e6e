// Package netproc runs one VM's guest network (package vm/netstack) in a
// process of its own: vmgated's re-exec role "netstack", jailed like QEMU
// (package isolate), and the daemon's side of the narrow channel to it.
//
// Threat model: the guest is hostile, and its frames, DNS queries and
// connection starts are parsed by the netstack (gVisor's TCP/IP stack and
// the name checks of netstack). A bug there, exploited by a guest, gives
// the attacker the netstack process and nothing more:
//
//   - its own user, mount, pid, ipc, uts and cgroup namespaces, no
//     capabilities, no_new_privs, rlimits;
//   - a root of its own with only vmgated's binary and libraries and the
//     resolver's configuration (/etc/resolv.conf, /etc/hosts), read-only:
//     no state directory, no audit log, no image, no other VM's sockets;
//   - a seccomp allowlist (isolate/seccomp, program "netstack") that lets
//     it create only AF_INET and AF_INET6 sockets: it cannot reach the
//     daemon's API socket, other VMs' sockets or abstract Unix sockets,
//     and cannot exec, fork, mount, ptrace or bind;
//   - one VM's network: it shares the host's network namespace, since it
//     makes the guest's outbound connections. That is the one authority a
//     compromised netstack keeps: it can connect where an unprivileged
//     process of the host can (systemd's IPAddressDeny= and a host
//     firewall still apply), and it can misreport its own VM's traffic.
//
// The channel is a SOCK_SEQPACKET socket pair: one JSON message per
// packet, at most [MaxMessage] bytes. The daemon sends the VM's pinned
// hosts once and then each policy (egress allowlist and limits); the
// netstack sends one record per DNS query and connection. The daemon
// treats every record as untrusted input: it parses it strictly, bounds
// it (the audit log truncates long fields), attributes it to the policy
// it sent, rate-limits what it writes of it, and kills a netstack whose
// allowed connections exceed what its policy's connect rate permits.
// Closing the channel ends the netstack; the daemon kills it if it has
// not gone within a second.
package netproc
