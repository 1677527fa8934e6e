// Package agentproto defines the wire contract between vmgated (the host) and
// the vmgate guest agent that runs inside every VM.
//
// # Transport
//
// One byte stream: the virtio-serial port named [PortName]. The host dials
// the Unix socket that QEMU exposes for that port, in the VM's private
// directory; the guest agent reads and writes the port's character device.
// The stream carries frames (frame.go): a length, a [FrameType], an id and
// a payload. Payloads are binary (codec.go): each message type has its
// MarshalBinary and UnmarshalBinary; data frames carry raw bytes.
//
// # Connection
//
// The host speaks first: [FrameHello] with a [Hello]. The agent answers
// with a [HelloReply], and that answer is the readiness signal: the agent
// only answers once the guest has booted far enough to run commands. An
// agent that speaks another [Protocol] answers with HelloReply.Error and
// hangs up. Requests ([FrameCall] with a [Call]; [CallSetTime],
// [CallInfo], [CallNetReady]) are answered by a [FrameReply] with the
// same id; several may be outstanding.
//
// # Commands
//
// One channel runs one command. The host opens it with [FrameOpen] (an
// [Open]: the [ExecSpec] and an optional terminal) on an id it has not
// used before in the connection; the agent answers [FrameOpenOK] (the
// command was accepted) or [FrameOpenFail] (refused, with the reason; the
// channel is over). Then the host sends stdin ([FrameData], [FrameEOF]),
// signals ([FrameSignal], RFC 4254 names: "TERM", "KILL", …; delivered to
// the command's whole process group) and terminal sizes ([FrameResize]);
// the agent sends stdout ([FrameData]; on a terminal, everything), stderr
// ([FrameStderr]), then [FrameEOF], [FrameExit] and [FrameClose] once the
// command has ended and its output is sent. The host's [FrameClose] before
// that kills the command's process group, and so does the end of the
// connection.
//
// Data frames are flow-controlled per channel and direction: a sender may
// send [Window] bytes, and more only as the receiver grants them with
// [FrameWindow] after its consumer has read them. Control frames are not
// counted, so a signal reaches a command that has stopped reading its
// input.
//
// A command that cannot be found exits 127 and one that cannot be executed
// exits 126, each with a one-line message on stderr, as a shell would.
//
// # Trust
//
// The channel is private to one VM: only vmgated can reach the socket (in
// a 0700 directory), and only the guest the other end. The guest is
// untrusted either way (its root can replace the agent), so the protocol
// neither authenticates nor encrypts: everything the host reads is the
// word of a possibly hostile guest, and the host's reader is bounded
// ([MaxGuestPayload], [Window]) and fuzzed. (Before protocol 1 this channel
// spoke SSH; its key exchange and signatures proved nothing against a
// guest that holds the image's keys. docs/benchmarks.md has what the
// change did to a restore, third round of levers.)
package agentproto

import "strconv"

// PortName is the virtio-serial port name of the agent channel. The guest
// finds it under /sys/class/virtio-ports/*/name (udev also links it as
// /dev/virtio-ports/vmgate.agent).
const PortName = "vmgate.agent"

// AgentBinaryPath is the agent inside the guest image.
const AgentBinaryPath = "/usr/local/sbin/vmgate-agent"

// Hello is the host's first frame.
type Hello struct {
	Protocol int
}

// HelloReply is the agent's answer to Hello. Error, when set, says why the
// agent cannot serve this host; it then hangs up.
type HelloReply struct {
	Protocol     int
	AgentVersion string
	Error        string
}

// Call is a request (FrameCall): the operation and its JSON argument.
type Call struct {
	Op   string
	Args []byte // the argument's encoding, or empty
}

// Reply answers a Call (FrameReply): the result's JSON, or Error.
type Reply struct {
	Error  string
	Result []byte // the result's encoding, or empty
}

// Calls the agent answers: the argument and the result.
const (
	CallSetTime  = "settime"  // SetTime; no result
	CallInfo     = "info"     // no argument; Info
	CallNetReady = "netready" // NetReady; NetReadyStatus
)

// Open is the payload of FrameOpen: the command and, for a terminal, its
// type and size.
type Open struct {
	Spec ExecSpec
	PTY  *PTY
}

// PTY is a requested pseudo-terminal.
type PTY struct {
	Term    string
	Columns uint32
	Rows    uint32
}

// Unprivileged guest account that commands may run as (ExecSpec.User).
const UnprivilegedUser = "agent"

// Exit codes the agent uses when it cannot start the command.
const (
	ExitNotFound      = 127
	ExitNotExecutable = 126
)

// ExecSpec describes one command to run in the guest.
type ExecSpec struct {
	// Argv is the program and its arguments; Argv[0] is looked up in PATH
	// when it has no slash. Required, non-empty, no NUL bytes.
	Argv []string
	// Env holds extra KEY=VALUE pairs added to the base environment
	// (PATH, HOME, USER, LANG, TERM for a pty).
	Env []string
	// Dir is the working directory; empty means the user's home.
	Dir string
	// User is the account the command runs as: "root" (the default, when
	// empty) or, with [FeatureUsers], any account of the guest's (at most
	// MaxUserName bytes); an older agent takes UnprivilegedUser only. An
	// account other than root that has uid 0 or gid 0 is refused, never
	// run as root; so is one the guest does not have. Either refusal is a
	// start failure: exit status 126 and a message naming the user.
	User string
}

// FeatureUsers: ExecSpec.User may name any account of the guest.
const FeatureUsers = "users"

// MaxUserName bounds ExecSpec.User.
const MaxUserName = 256

// SetTime is the argument of CallSetTime.
type SetTime struct {
	UnixNano int64
	// Entropy, when present (at most MaxEntropy bytes), is host randomness
	// the agent credits to the guest's entropy pool before it forces the
	// kernel's generator to reseed: a VM restored from a snapshot would
	// otherwise continue its template's random stream.
	Entropy []byte
}

// MaxEntropy bounds SetTime.Entropy.
const MaxEntropy = 512

// Info is the result of CallInfo.
type Info struct {
	AgentVersion string
	Kernel       string
	Hostname     string
	BootID       string
	// Features lists what this agent can do beyond running commands
	// ([FeatureTransfer], [FeatureProcs], [FeatureUsers], [FeatureFS]);
	// an older agent lists fewer, or nothing.
	Features []string
}

// FeatureTransfer: the agent has the put and get subcommands (PutArgv,
// GetArgv).
const FeatureTransfer = "transfer"

// NetReady is the argument of CallNetReady: wait at most TimeoutMS
// (capped at MaxNetReadyTimeout) for the guest network to be usable.
type NetReady struct {
	TimeoutMS int64
}

// MaxNetReadyTimeout bounds NetReady.TimeoutMS, in milliseconds.
const MaxNetReadyTimeout = 5 * 60 * 1000

// NetReadyStatus is the result of CallNetReady. The network
// is ready when an Ethernet interface is up with an IPv4 address, a default
// route leaves through it, and the first nameserver of /etc/resolv.conf
// answered a query for [ReadinessName]. Detail says what was still
// missing when Ready is false.
type NetReadyStatus struct {
	Ready     bool
	Interface string
	Address   string
	Gateway   string
	Resolver  string
	Detail    string
	WaitedMS  int64
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
// pseudo file systems, configures the network statically (package
// guest/netconf), serves the host and reaps orphans.
const (
	RootInitMarker = "/etc/vmgate/agent-is-init"
	RootInitName   = "vmgate-init"
)

// NetworkCommand is the agent's subcommand that configures the guest's
// network as an imported root's init does: what an imported root that
// keeps its own systemd runs as a unit before its network is up
// (vmgated image import --init image).
const NetworkCommand = "network"
