// Package netproc runs one VM's guest network (package vm/netstack) in a
// process of its own: vmgated's re-exec role "netstack", and the daemon's
// side of the narrow channel to it. The daemon either jails the netstack
// itself (package isolate; vmgated serve without --netstack-socket), or
// asks systemd for one (vmgate-netstack.socket starts a
// vmgate-netstack@.service instance per connection).
//
// # Threat model
//
// The guest is hostile, and its frames, DNS queries and connection starts
// are parsed by the netstack (gVisor's TCP/IP stack and the name checks of
// vm/netstack). A guest that exploits a bug there runs code in the
// netstack process. What that process is, by the time it reads the
// guest's first frame:
//
//   - Jailed by vmgated: new user, mount, pid, ipc, uts and cgroup
//     namespaces; on the host it runs as the daemon's uid, with no
//     capabilities, no_new_privs and rlimits (no file it could write, 4 GiB
//     of address space). Its root is a tmpfs holding only vmgated's binary
//     and libraries, /etc/resolv.conf and /etc/hosts, read-only, plus
//     /dev/null, /dev/urandom and a /proc of its own pid namespace: no
//     state directory, audit log, image or other VM's sockets.
//   - Started by systemd: a transient user of its own (DynamicUser=), no
//     capabilities, no_new_privs, private /dev, /proc of its own processes,
//     and an empty root (RootDirectory=) with only vmgated's binary, its
//     libraries, resolv.conf, hosts and nsswitch.conf bound read-only, and
//     /sys read-only; /tmp, /var/tmp, /dev/shm and /run are empty
//     read-only tmpfs, so it can write no file anywhere.
//   - Seccomp, first filter: the jail's allowlist (isolate/seccomp,
//     program "netstack"), or under systemd the unit's SystemCallFilter=
//     (@system-service, minus @privileged, @mount, memfd_create and the
//     rest of its deny list). Both let it create only AF_INET and AF_INET6
//     sockets (the unit through RestrictAddressFamilies=): it cannot reach
//     the daemon's API socket, other VMs' sockets or abstract Unix sockets.
//     The jail's also refuses bind, ioctl, mount, ptrace and any new
//     process; it must allow execve, for the jail's exec of vmgated.
//   - Seccomp, second filter: once its start-up is done (the channel open,
//     QEMU's listening socket received, the network built) and before it
//     accepts QEMU's connection, the netstack loads "netstack-serving"
//     itself: execve and execveat fail, and so does every new process
//     (fork, vfork, clone without CLONE_THREAD; clone3 gets ENOSYS so
//     that glibc falls back to clone). Threads still start. It cannot run
//     another program, and a filter cannot be removed.
//
// What the attacker keeps is what the netstack exists for, one VM's
// network, in the host's network namespace (it makes the guest's outbound
// connections):
//
//   - It can connect where an unprivileged process of the host can, past
//     its VM's policy. Jailed by vmgated that includes loopback services
//     (databases, the SSH front door, --metrics-listen), link-local
//     addresses (cloud metadata) and the host's own addresses; only a host
//     firewall stands in the way. Under systemd, IPAddressDeny= drops
//     loopback, link-local and multicast traffic in the kernel, but the
//     host's other addresses, private ranges and the Internet stay
//     reachable, and so does a host service listening on all addresses.
//   - It can read what its root holds: vmgated's binary and libraries and
//     the resolver's files (host names in /etc/hosts, the name servers);
//     under systemd also the kernel's view in /sys.
//   - It can lie about its own VM's traffic: misreport or omit records,
//     answer its guest as it likes (the guest is hostile anyway). The
//     daemon treats every record as untrusted input: it parses it
//     strictly, bounds it (the audit log truncates long fields),
//     attributes it to the policy it sent, rate-limits what it writes of
//     it, and kills a netstack whose allowed connections exceed what its
//     policy's connect rate permits, a bound that a policy sent again does
//     not renew.
//   - It can use the kernel's interfaces its filters allow (the network
//     stack above all) and the memory, threads and descriptors its limits
//     allow.
//   - It holds the values of its VM's secrets (policy [[secret]]) that
//     its current command's profile grants, its session's CA key, and
//     the roots bundle the secrets' hosts are verified against
//     (docs/secrets.md): an attacker there learns those values, and
//     can send them where the host's network reaches, past the
//     secrets' hosts. It holds no other VM's, and no secret its
//     profile does not grant; the guest itself never holds a value.
//   - It carries the connections into its guest's published ports
//     (vm-exec --publish): it reads and writes their bytes, as the guest
//     would, and can refuse or drop them. It holds only its end of a
//     socket pair per connection, which the daemon made: never the host
//     client's socket, its address or credentials, nor the published
//     listener. The daemon counts the bytes and times the connection
//     itself, and reads one status byte of the netstack's, whose meaning
//     it looks up in a table (a byte outside it is an error).
//
// # Channel and life
//
// The channel is a SOCK_SEQPACKET socket pair (or, under systemd, the
// accepted connection): one JSON message per packet, at most [MaxMessage]
// bytes. The daemon sends the VM's pinned hosts and QEMU's listening
// socket (and the secrets' roots bundle, a second descriptor) once and then each policy (egress allowlist and limits), and a
// dial for each connection into a published port, with its end of a
// socket pair (DialGuest: the netstack connects from the gateway's
// address to the guest's port, writes one status byte on the pair and
// relays it); the netstack sends one record per DNS query and
// connection, and says when each policy is in force. The daemon's
// SetPolicy waits for that, so that a command started after it (a
// narrowed or locked network's above all) never has its first packets
// judged by the policy before: without the wait the netstack's two
// readers race, and the guest's next datagram was seen under the old
// policy at once (TestNetstack_PolicyInForce). A netstack that does not
// say so within applyTimeout is killed. The netstack
// ends when the daemon closes the channel, or when QEMU's connection ends
// (the VM is being destroyed, or QEMU died; QEMU never connects again): it
// then says so in a last message, so that the daemon does not log its end
// as a failure. The daemon kills a jailed netstack that has not gone
// within a second of its Close; a systemd instance whose daemon went away
// ends with QEMU's connection, at the latest after RuntimeMaxSec=.
package netproc
