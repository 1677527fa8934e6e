// Package agent implements the vmgate guest agent: the daemon that runs
// inside every vmgate VM and executes commands on behalf of the host.
//
// The agent speaks SSH (golang.org/x/crypto/ssh) on the virtio-serial port
// named agentproto.PortName. The host (vmgated) connects to the QEMU socket
// behind that port, authenticates as agentproto.User with the image's client
// key and opens one session channel per command. The wire contract (request
// names, payloads, exit codes) is defined in package agentproto; this package
// is its guest-side implementation.
//
// [Serve] handles one SSH connection on any [net.Conn]; [Main] is the daemon
// entry point that loads the keys from the image, opens the port device and
// serves one host connection after another on it.
//
// # Threat model
//
// The VM, not the agent, is the security boundary. The agent runs as root in
// a disposable VM and deliberately gives whoever holds the authorised client
// key full control of the guest: commands run as root unless they ask for
// agentproto.UnprivilegedUser. It therefore trusts exactly one party, the
// holder of a key listed in agentproto.AuthorizedKeysPath, and rejects every
// other user name, key, authentication method, channel type and global
// request. Requests from the host are still validated (argv, environment,
// user) so that malformed input fails cleanly instead of running something
// unintended.
//
// Everything else in the guest is untrusted: the commands the agent runs may
// be hostile and, as root, may tamper with the agent, read its host key or
// replace its answers. The host must therefore treat every reply (output,
// exit codes, [agentproto.Info]) as untrusted data. The pinned host key only
// proves that the host talks to an agent started from the expected image,
// not that the guest is still uncompromised. The agent's own duties towards
// the host are liveness and hygiene: when a session is closed or its
// connection is lost while its command still runs, it kills the command's
// whole process group, and it never blocks a session forever on pipes that
// stray background processes keep open.
package agent
