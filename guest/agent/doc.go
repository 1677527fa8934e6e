// Package agent implements the vmgate guest agent: the daemon that runs
// inside every vmgate VM and executes commands on behalf of the host.
//
// The agent speaks the framed agent protocol (package agentproto, run by
// package agentconn) on the virtio-serial port named agentproto.PortName.
// The host (vmgated) connects to the QEMU socket behind that port, sends
// its hello and opens one channel per command. The wire contract (frames,
// calls, payloads, exit codes) is defined in package agentproto; this
// package is its guest-side implementation.
//
// [Serve] handles one connection on any [net.Conn]; [Main] is the daemon
// entry point that opens the port device and serves one host connection
// after another on it.
//
// Background processes (agentproto's proc calls, procs.go) are the
// agent's, not a connection's: a table of them, each with its output in
// bounded buffers (procbuf.go) and its input queued (procinput.go),
// outlives every host connection, so that the next connection, and the
// VM after a pause, a restore or a fork, finds them by their handles.
//
// # Threat model
//
// The VM, not the agent, is the security boundary. The agent runs as root in
// a disposable VM and deliberately gives the host full control of the
// guest: commands run as root unless they name another account of the
// guest (agentproto.ExecSpec.User). It trusts exactly one party, whoever is at
// the host's end of its port, which only vmgated can reach (QEMU's socket
// for the port is in the VM's 0700 directory); no process in the guest
// can write to the host's side of the port. Requests from the host are
// still validated (argv, environment, user, terminal) so that malformed
// input fails cleanly instead of running something unintended. The
// guest's account database is not trusted to keep its promise either: an
// account other than root that resolves to uid 0 or gid 0 (an imported
// root may bring its own "agent" entry) is refused with exit code 126, so
// that a policy's user = "agent" never runs a command as root.
//
// Everything else in the guest is untrusted: the commands the agent runs may
// be hostile and, as root, may tamper with the agent or replace its
// answers. The host therefore treats every frame and reply (output, exit
// codes, [agentproto.Info]) as untrusted data, bounded by package
// agentconn. The agent's own duties towards the host are liveness and
// hygiene: when a channel is closed or its connection is lost while its
// command still runs, it kills the command's whole process group, and it
// never blocks a channel forever on pipes that stray background processes
// keep open.
package agent
