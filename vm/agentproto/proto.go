// Package agentproto defines the wire contract between vmgated (the host) and
// the vmgate guest agent that runs inside every VM.
//
// Transport: the SSH protocol (golang.org/x/crypto/ssh) carried over one
// virtio-serial port named [PortName]. The host dials the Unix socket that
// QEMU exposes for that port; the guest agent serves SSH on the port's
// character device. The completed SSH handshake is the readiness signal: the
// agent only answers once the guest has booted far enough to run commands.
//
// Authentication: the host authenticates as [User] with the image's client
// key (public half in [AuthorizedKeysPath] inside the guest). The agent's host
// key ([HostKeyPath]) is generated at image build time and pinned by the host
// (ssh.FixedHostKey); the host never accepts an unknown agent key.
//
// One SSH session channel runs one command. A session accepts, in order:
// optional "env" requests (RFC 4254 §6.4), an optional "pty-req", then
// exactly one of:
//   - [ExecRequest] ("vmgate-exec@vmgate"): payload is ssh.Marshal(ExecPayload)
//     whose JSON field holds an [ExecSpec]; argv is run without a shell;
//   - "exec" (RFC 4254 §6.5): the command string is run with /bin/sh -c.
//
// While it runs, the host may send "signal" requests with RFC 4254 signal
// names ("TERM", "KILL", "INT", "HUP", …); the agent delivers them to the
// command's whole process group. The session ends with "exit-status" or
// "exit-signal" followed by channel close. Closing the channel (or losing the
// connection) before that kills the command's process group.
//
// A command that cannot be found exits 127 and one that cannot be executed
// exits 126, each with a one-line message on stderr, as a shell would.
//
// Global requests: [SetTimeRequest] sets the guest clock, [InfoRequest] returns
// [Info], [NetReadyRequest] waits until the guest's network is usable and
// returns [NetReadyStatus].
package agentproto

import "strconv"

// PortName is the virtio-serial port name of the agent channel. The guest
// finds it under /sys/class/virtio-ports/*/name (udev also links it as
// /dev/virtio-ports/vmgate.agent).
const PortName = "vmgate.agent"

// User is the SSH user name the host logs in as.
const User = "vmgate"

// Paths inside the guest image.
const (
	HostKeyPath        = "/etc/vmgate/agent_host_ed25519"
	AuthorizedKeysPath = "/etc/vmgate/authorized_keys"
	AgentBinaryPath    = "/usr/local/sbin/vmgate-agent"
)

// Unprivileged guest account that commands may run as (ExecSpec.User).
const UnprivilegedUser = "agent"

// Request names.
const (
	ExecRequest     = "vmgate-exec@vmgate"
	SetTimeRequest  = "vmgate-settime@vmgate"
	InfoRequest     = "vmgate-info@vmgate"
	NetReadyRequest = "vmgate-netready@vmgate"
)

// Exit codes the agent uses when it cannot start the command.
const (
	ExitNotFound      = 127
	ExitNotExecutable = 126
)

// ExecPayload is the SSH wire payload of ExecRequest and of the
// SetTimeRequest/InfoRequest replies: one JSON document in an SSH string.
type ExecPayload struct {
	JSON string
}

// ExecSpec describes one command to run in the guest.
type ExecSpec struct {
	// Argv is the program and its arguments; Argv[0] is looked up in PATH
	// when it has no slash. Required, non-empty, no NUL bytes.
	Argv []string `json:"argv"`
	// Env holds extra KEY=VALUE pairs added to the base environment
	// (PATH, HOME, USER, LANG, TERM for a pty).
	Env []string `json:"env,omitempty"`
	// Dir is the working directory; empty means the user's home.
	Dir string `json:"dir,omitempty"`
	// User is "root" (default when empty) or UnprivilegedUser.
	User string `json:"user,omitempty"`
}

// SetTime is the JSON payload of SetTimeRequest.
type SetTime struct {
	UnixNano int64 `json:"unix_nano"`
	// Entropy, when present (at most MaxEntropy bytes), is host randomness
	// the agent credits to the guest's entropy pool before it forces the
	// kernel's generator to reseed: a VM restored from a snapshot would
	// otherwise continue its template's random stream.
	Entropy []byte `json:"entropy,omitempty"`
}

// MaxEntropy bounds SetTime.Entropy.
const MaxEntropy = 512

// Info is the JSON reply payload of InfoRequest.
type Info struct {
	AgentVersion string `json:"agent_version"`
	Kernel       string `json:"kernel"`
	Hostname     string `json:"hostname"`
	BootID       string `json:"boot_id"`
	// Features lists what this agent can do beyond running commands
	// ([FeatureTransfer]); an older agent lists nothing.
	Features []string `json:"features,omitempty"`
}

// FeatureTransfer: the agent has the put and get subcommands (PutArgv,
// GetArgv).
const FeatureTransfer = "transfer"

// NetReady is the JSON payload of NetReadyRequest: wait at most TimeoutMS
// (capped at MaxNetReadyTimeout) for the guest network to be usable.
type NetReady struct {
	TimeoutMS int64 `json:"timeout_ms"`
}

// MaxNetReadyTimeout bounds NetReady.TimeoutMS, in milliseconds.
const MaxNetReadyTimeout = 5 * 60 * 1000

// NetReadyStatus is the JSON reply payload of NetReadyRequest. The network
// is ready when an Ethernet interface is up with an IPv4 address, a default
// route leaves through it, and the first nameserver of /etc/resolv.conf
// answered a query for [ReadinessName]. Detail says what was still
// missing when Ready is false.
type NetReadyStatus struct {
	Ready     bool   `json:"ready"`
	Interface string `json:"interface,omitempty"`
	Address   string `json:"address,omitempty"`
	Gateway   string `json:"gateway,omitempty"`
	Resolver  string `json:"resolver,omitempty"`
	Detail    string `json:"detail,omitempty"`
	WaitedMS  int64  `json:"waited_ms"`
}

// ReadinessName is the name the agent's readiness probe asks the guest's
// resolver for. It is under .invalid (RFC 6761), so no real resolver can
// answer it with an address; vmgated's network answers it itself with
// NXDOMAIN and does not audit it.
const ReadinessName = "ready.vmgate.invalid"

// File transfers (vm-exec --put, --get and cp) run the agent binary as an
// ordinary command (ExecSpec), with a tar stream on stdin (put) or stdout
// (get); a refusal is a message on stderr and exit status 1. The
// subcommands and their flags are built by [PutArgv] and [GetArgv]; the
// stream's rules are package internal/transfer's.
const (
	TransferPut = "put"
	TransferGet = "get"
)

// PutArgv is the command that extracts a tar stream whose top is top at
// dest in the guest, as cp would (inside dest when it is a directory or
// ends in "/").
func PutArgv(dest, top string, maxBytes int64, maxFiles int) []string {
	return []string{AgentBinaryPath, TransferPut, "--top", top, "--max-bytes", strconv.FormatInt(maxBytes, 10),
		"--max-files", strconv.Itoa(maxFiles), "--", dest}
}

// GetArgv is the command that writes the tree at path in the guest as a
// tar stream to stdout.
func GetArgv(path string, maxBytes int64, maxFiles int) []string {
	return []string{AgentBinaryPath, TransferGet, "--max-bytes", strconv.FormatInt(maxBytes, 10),
		"--max-files", strconv.Itoa(maxFiles), "--", path}
}

// RootInitMarker, present in a guest root filesystem, makes the
// initramfs start the agent binary as the root's init (argv[0]
// [RootInitName]) instead of /sbin/init: imported images, which have no
// init system of their own, boot that way. The agent then mounts the
// pseudo file systems, configures the network statically with the
// addresses below, serves the host and reaps orphans.
const (
	RootInitMarker = "/etc/vmgate/agent-is-init"
	RootInitName   = "vmgate-init"
)

// The guest network as vmgated's user-space network serves it (by DHCP,
// and statically for a guest without a DHCP client): the guest's address
// and prefix, the gateway, the resolver.
const (
	GuestCIDR      = "10.0.2.15/24"
	GatewayAddress = "10.0.2.2"
	ResolverAddr   = "10.0.2.3"
)
