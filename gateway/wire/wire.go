// Package wire defines vmgate's local API: HTTP/1.1 + JSON over the gateway's
// Unix socket, plus the framed stream an exec switches to. It is shared by
// the daemon (package gateway) and the client (vm-exec); docs/protocol.md
// describes it for other clients.
//
// Exec: the client sends POST /v1/exec with an ExecRequest JSON body and the
// headers "Connection: Upgrade" and "Upgrade: vmgate-exec/1". Refusals come
// back as ordinary HTTP responses with a JSON Error body (400 malformed, 403
// denied by policy, 503 busy or audit unavailable). On acceptance the daemon
// answers 101 Switching Protocols and both sides exchange frames on the same
// connection until the daemon sends a final Result or Failure frame.
//
// A frame is one type byte, a 4-byte big-endian payload length, and the
// payload (at most MaxFrame bytes).
//
//	client → daemon: 'p' put tar bytes, 'P' end of one put,
//	                 'i' stdin bytes, 'e' stdin EOF, 's' signal name ("INT", "TERM")
//	daemon → client: 'o' stdout bytes, 'E' stderr bytes,
//	                 'g' get tar bytes, 'G' end of one get (Transfer JSON),
//	                 'r' Result JSON (last), 'x' Error JSON (last)
//
// File transfers: for each ExecRequest.Put, in order and before any stdin
// frame, the client sends one tar stream as 'p' frames and a 'P' frame;
// the daemon checks it and relays it into the guest before the command
// runs. After the command, for each ExecRequest.Get, the daemon sends the
// checked tar stream of that guest path as 'g' frames and a 'G' frame
// whose Transfer says whether the stream is complete: a client keeps what
// it received only when Transfer.Error is empty. A failed put ends the
// exec with an Error frame (code transfer_failed) before the command; a
// failed get is reported in its 'G' frame and in Result.Transfers.
//
// Closing the connection before the final frame kills the command and its VM.
package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/vmgate/vmgate/internal/bytestr"
	"github.com/vmgate/vmgate/internal/names"
	"github.com/vmgate/vmgate/internal/signum"
	"github.com/vmgate/vmgate/internal/transfer"
	"github.com/vmgate/vmgate/internal/tty"
)

// DefaultSocket is the daemon's socket when none is configured; clients
// use it when neither a path nor VMGATE_SOCKET is given.
const DefaultSocket = "/run/vmgate/vmgate.sock"

// Version is the API version prefix of every path.
const Version = "v1"

// Upgrade is the protocol token of an exec stream.
const Upgrade = "vmgate-exec/1"

// MaxFrame bounds a frame's payload.
const MaxFrame = 1 << 20

// MaxRequestBody bounds the JSON body of POST /v1/exec.
const MaxRequestBody = 1 << 20

// Frame types.
const (
	FrameStdin    byte = 'i'
	FrameStdinEOF byte = 'e'
	FrameSignal   byte = 's'
	FrameResize   byte = 'z' // a TTY command's new size: JSON {"cols", "rows"}
	FrameStdout   byte = 'o'
	FrameStderr   byte = 'E'
	FrameResult   byte = 'r'
	FrameError    byte = 'x'
	FramePut      byte = 'p'
	FramePutEnd   byte = 'P'
	FrameGet      byte = 'g'
	FrameGetEnd   byte = 'G'
)

// MaxTransfers bounds the puts and gets of one request together.
const MaxTransfers = 64

// maxGuestPath bounds a transfer's guest path.
const maxGuestPath = 4096

// PutSpec is one tree to copy into the guest before the command.
type PutSpec struct {
	// Guest is the destination, as cp takes it: inside it when it is a
	// directory or ends in "/", else the tree's new name. Relative paths
	// are the command's (ExecRequest.Dir, or the user's home).
	Guest string `json:"guest"`
	// Top is the name of the tree's first tar entry (the local base name).
	Top string `json:"top"`
	// Files and Bytes are what the client will send: entries and content
	// bytes. The policy refuses a put over its limits before any VM is
	// touched; the stream is held to the limits too, not to these.
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
	// Local is the client's source path, for the audit log only.
	Local string `json:"local,omitempty"`
}

// GetSpec is one guest path to copy out after the command.
type GetSpec struct {
	Guest string `json:"guest"`
	// Local is the client's destination, for the audit log only.
	Local string `json:"local,omitempty"`
}

// Transfer is the outcome of one put or get.
type Transfer struct {
	Direction string `json:"direction"` // "put" or "get"
	Guest     string `json:"guest"`
	Files     int    `json:"files"`
	Bytes     int64  `json:"bytes"`
	// SHA256 is the hex SHA-256 of the tar stream as relayed; FileSHA256
	// that of the content when the transfer is one regular file.
	SHA256     string `json:"sha256,omitempty"`
	FileSHA256 string `json:"file_sha256,omitempty"`
	// Error, when set, says why the transfer failed; nothing of it is to
	// be kept.
	Error string `json:"error,omitempty"`
}

// ExecRequest is the body of POST /v1/exec.
type ExecRequest struct {
	// Argv is the program and its arguments. With Shell set, Argv must hold
	// exactly one element, the shell string, run as sh -c STRING. Its
	// elements, and Env's, may hold any bytes (but NUL): in JSON an element
	// that is not valid UTF-8 is {"b64": "…"} (package bytestr), so that
	// the command runs as given, byte for byte.
	Argv  bytestr.List `json:"argv"`
	Shell bool         `json:"shell,omitempty"`
	// Login, with Shell, runs the string in the image's login shell:
	// bash -l -c STRING, or sh -c STRING in an image without bash (the
	// E2B door's commands). The policy judges it as any shell string.
	Login bool `json:"login,omitempty"`
	// Env holds KEY=VALUE pairs the policy may pass on.
	Env bytestr.List `json:"env,omitempty"`
	// Secrets names the policy's secrets ([[secret]]) the command asks
	// for: it sees each one's placeholder in the variable of its name,
	// and the VM's network stack puts the value in on the way to the
	// secret's hosts (docs/secrets.md). A session keeps them.
	Secrets []string `json:"secrets,omitempty"`
	// Dir is the working directory in the guest. It, Session and the
	// transfers' paths are text: invalid UTF-8 in them would reach the
	// daemon as U+FFFD, so a client refuses it (vm-exec does).
	Dir string `json:"dir,omitempty"`
	// TimeoutMS requests a time limit; 0 means the policy default.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Session names a kept VM of the caller's; empty means a fresh VM.
	Session string `json:"session,omitempty"`
	// Stdin tells the daemon the client will stream stdin frames; without
	// it the command gets an empty stdin.
	Stdin bool `json:"stdin,omitempty"`
	// TTY runs the command on a pseudo-terminal (stdout and stderr then
	// arrive merged as stdout frames).
	TTY *TTY `json:"tty,omitempty"`
	// Put and Get copy files in before and out after the command (see
	// the package doc). A request with a Session may carry transfers and
	// no Argv at all (vm-exec cp).
	Put []PutSpec `json:"put,omitempty"`
	Get []GetSpec `json:"get,omitempty"`
	// Receipt asks for a signed receipt of the request (docs/security.md,
	// "Receipts"): in Result.Receipt, or, for a request refused or failed
	// after its decision was recorded, in Error.Receipt.
	Receipt bool `json:"receipt,omitempty"`
	// Net narrows the profile's network for this command (vm-exec
	// --no-network, --net-allow): nil, the profile's (or the session's
	// lock's).
	Net *NetLimit `json:"net,omitempty"`
	// User is the guest user to run as (vm-exec --user): one of the
	// profile's users; empty, the profile's user.
	User string `json:"user,omitempty"`
	// Image is the image a fresh VM or a new session runs in (vm-exec
	// --image): one of the profile's images; empty, the profile's image.
	// A command in an existing session runs in the session's image: one
	// that names another is refused.
	Image string `json:"image,omitempty"`
}

// NetLimit is a network narrowed to the egress rules in Allow (the
// policy's network.allow syntax, "HOST:PORT"); none: no network at all.
// Each rule must be within the profile's rules and the session's lock:
// the daemon refuses any other (denied, naming it), never clamps it. It
// is an exec request's Net, and the body of POST
// /v1/sessions/{name}/net-lock.
type NetLimit struct {
	Allow []string `json:"allow"`
}

// DecodeNetLimit parses a NetLimit body strictly: unknown fields and
// trailing data are errors. The policy judges the rules.
func DecodeNetLimit(r io.Reader) (*NetLimit, error) {
	dec := json.NewDecoder(io.LimitReader(r, MaxRequestBody))
	dec.DisallowUnknownFields()
	var l NetLimit
	if err := dec.Decode(&l); err != nil {
		return nil, fmt.Errorf("network limit: %w", err)
	}
	if dec.More() {
		return nil, errors.New("network limit: trailing data after the JSON object")
	}
	for _, a := range l.Allow {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, errors.New("network limit: NUL byte in a rule")
		}
	}
	return &l, nil
}

// TransferOnly reports whether the request copies files and runs nothing.
func (r *ExecRequest) TransferOnly() bool {
	return len(r.Argv) == 0 && len(r.Put)+len(r.Get) > 0
}

// CheckText returns an error naming the first field of r that is text
// on the wire (Dir, Session, a transfer's paths) and holds invalid UTF-8:
// encoded, it would reach the daemon as U+FFFD, another path. Only Argv
// and Env carry any bytes. A client checks it before it sends.
func (r *ExecRequest) CheckText() error {
	type field struct{ name, v string }
	fields := []field{{"the working directory", r.Dir}, {"the session name", r.Session}}
	for i, p := range r.Put {
		fields = append(fields, field{fmt.Sprintf("put %d's guest path", i), p.Guest},
			field{fmt.Sprintf("put %d's name", i), p.Top}, field{fmt.Sprintf("put %d's local path", i), p.Local})
	}
	for i, g := range r.Get {
		fields = append(fields, field{fmt.Sprintf("get %d's guest path", i), g.Guest}, field{fmt.Sprintf("get %d's local path", i), g.Local})
	}
	for _, f := range fields {
		if !utf8.ValidString(f.v) {
			return fmt.Errorf("%s %q is not valid UTF-8: only the command's arguments and environment may hold any bytes", f.name, f.v)
		}
	}
	return nil
}

// GetTop is the name of the tree a get of guest path p delivers: its last
// element, or "" when it has none (".", "/").
func GetTop(p string) string {
	top := path.Base(path.Clean(p))
	if top == "." || top == "/" || top == ".." {
		return ""
	}
	return top
}

// TTY is a requested terminal.
type TTY struct {
	Term string `json:"term,omitempty"`
	Cols uint32 `json:"cols,omitempty"`
	Rows uint32 `json:"rows,omitempty"`
}

// Result is the final frame of a completed exec.
type Result struct {
	RequestID       string `json:"request_id"`
	VMID            string `json:"vm_id"`
	Profile         string `json:"profile"`
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal,omitempty"`
	TimedOut        bool   `json:"timed_out"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	StdoutBytes     int64  `json:"stdout_bytes"`
	StderrBytes     int64  `json:"stderr_bytes"`
	QueueMS         int64  `json:"queue_ms"`
	BootMS          int64  `json:"boot_ms"`
	// VMStart is "boot", "restore" or "pool" (see docs/protocol.md).
	VMStart string `json:"vm_start,omitempty"`
	ExecMS  int64  `json:"exec_ms"`
	TotalMS int64  `json:"total_ms"`
	// Transfers lists the request's puts and gets, in order.
	Transfers []Transfer `json:"transfers,omitempty"`
	// Receipt is the signed receipt the request asked for, the document
	// exactly as signed (package gateway/receipt).
	Receipt json.RawMessage `json:"receipt,omitempty"`
}

// ShellExitCode is the command's exit code as a shell reports it: its own,
// or 128+N when signal N killed it (the guest's numbering: SIGXCPU is
// 152 whatever the client's system).
func (r *Result) ShellExitCode() int {
	if r.Signal != "" {
		return signum.ExitCode(r.Signal)
	}
	return r.ExitCode
}

// Exit codes of vm-exec (and of the SSH front door, vmgated debug run) for
// vmgate's own failures, above the guest command's range (0–128+signal),
// so that a caller can tell "the command failed" from "vmgate could not
// run it". ExitCodes says what each means (docs/protocol.md renders it).
const (
	ExitInternal    = 200
	ExitDenied      = 201
	ExitBusy        = 202
	ExitTimedOut    = 203
	ExitUnreachable = 204
	ExitVMFailed    = 205
	ExitTransfer    = 206
	// ExitUsage: an invalid command line; above the guest's range like
	// the others, where the customary 2 would be mistaken for the
	// command's own.
	ExitUsage = 207
)

// ExitCodes says what each of vmgate's own exit codes means, in order.
var ExitCodes = []struct {
	Code    int
	Meaning string
}{
	{ExitInternal, "vmgate itself failed (I/O error, bad answer)"},
	{ExitDenied, "refused: denied by policy (the message names the profile and rule), or a request the daemon will not take as given (`bad_request`: bad base64 in argv or env, a NUL byte, a body over 1 MiB; the message says which)"},
	{ExitBusy, "busy: no VM slot in time, or the caller's share is in use"},
	{ExitTimedOut, "the command ran past its time limit and was killed"},
	{ExitUnreachable, "the gateway socket could not be reached"},
	{ExitVMFailed, "the VM could not start or died"},
	{ExitTransfer, "a file transfer failed (after a command that succeeded; docs/files.md)"},
	{ExitUsage, "invalid command line: an unknown flag, a missing argument, a bad value"},
}

// ExitStatus is the exit code a client reports for a command that ran:
// ExitTimedOut when its time limit killed it, else the command's own as a
// shell reports it (shellCode).
func ExitStatus(timedOut bool, shellCode int) int {
	if timedOut {
		return ExitTimedOut
	}
	return shellCode
}

// ExitStatus is ExitStatus of the result.
func (r *Result) ExitStatus() int { return ExitStatus(r.TimedOut, r.ShellExitCode()) }

// Error codes in Error.Code.
const (
	CodeBadRequest = "bad_request"
	CodeDenied     = "denied"
	CodeBusy       = "busy"
	CodeAudit      = "audit_unavailable"
	CodeVM         = "vm_failed"
	CodeInternal   = "internal"
	CodeNotFound   = "not_found"
	CodeShutdown   = "shutting_down"
	CodeTransfer   = "transfer_failed"
)

// Kind is one way a request is refused or fails, with everything each
// front door reports of it: its code in Error.Code, the local API's HTTP
// status, and the exit code of vm-exec and the SSH front door. Kinds is
// the one table of them; the daemon's refusals are Kinds (an error, for
// errors.Is), and docs/protocol.md renders the table.
type Kind struct {
	Name string
	Code string
	// Status is the local API's HTTP status; 0 for a kind only an exec
	// stream's error frame carries.
	Status  int
	Exit    int
	Meaning string
}

func (k *Kind) Error() string { return k.Name }

// The kinds, in the order docs/protocol.md lists them.
var (
	KindBadRequest = &Kind{"bad request", CodeBadRequest, 400, ExitDenied,
		"malformed JSON, unknown field, empty argv, bad base64 in argv or env, NUL bytes, body > 1 MiB, no `Upgrade` header"}
	KindUnidentified = &Kind{"caller not identified", CodeDenied, 401, ExitDenied, "the peer could not be identified"}
	KindDenied       = &Kind{"denied by policy", CodeDenied, 403, ExitDenied, "the policy refused the request (`profile`, `rule` say why)"}
	KindNotFound     = &Kind{"not found", CodeNotFound, 404, ExitInternal, "no such endpoint, or no session of that name of this caller"}
	KindSessionBusy  = &Kind{"session busy", CodeBusy, 409, ExitBusy, "the named session is running another command"}
	KindBusy         = &Kind{"busy", CodeBusy, 503, ExitBusy, "no VM slot free: the wait queue was full or the wait timed out"}
	KindAudit        = &Kind{"audit log unavailable", CodeAudit, 503, ExitInternal, "the audit log cannot be written; the daemon fails closed"}
	KindShutdown     = &Kind{"vmgated is shutting down", CodeShutdown, 503, ExitInternal, "the daemon is stopping"}
	KindVM           = &Kind{"vm failed", CodeVM, 500, ExitVMFailed, "the VM could not be started; in an exec stream: it died, or the command's outcome is unknown"}
	KindInternal     = &Kind{"internal error", CodeInternal, 500, ExitInternal, "the daemon failed otherwise (an I/O error)"}
	KindTransfer     = &Kind{"transfer failed", CodeTransfer, 0, ExitTransfer, "a put failed, so the command did not run (exec stream only)"}
)

// Kinds lists every kind.
var Kinds = []*Kind{KindBadRequest, KindUnidentified, KindDenied, KindNotFound, KindSessionBusy, KindBusy, KindAudit, KindShutdown, KindVM, KindInternal, KindTransfer}

// ExitCode is the exit code a client reports for a refusal or failure
// with this error's code.
func (e Error) ExitCode() int {
	for _, k := range Kinds {
		if k.Code == e.Code {
			return k.Exit
		}
	}
	return ExitInternal
}

// Message is the error as a person reads it: a refusal by policy names the
// profile and the rule, busy says so.
func (e Error) Message() string {
	switch e.Code {
	case CodeDenied:
		msg := "denied by policy"
		if e.Profile != "" {
			msg += " profile " + e.Profile
		}
		if e.Rule != "" {
			msg += ": rule " + e.Rule
		}
		return msg + ": " + e.Error
	case CodeBusy:
		return "gateway busy: " + e.Error
	}
	return e.Error
}

// Error is the JSON body of a refusal and the payload of an error frame.
type Error struct {
	Code      string `json:"code"`
	Error     string `json:"error"`
	Profile   string `json:"profile,omitempty"`
	Rule      string `json:"rule,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	// Receipt is the signed receipt of a refused or failed request that
	// asked for one, when its decision was recorded (a denial says so).
	Receipt json.RawMessage `json:"receipt,omitempty"`
	// FileError names a file operation's refusal by the guest
	// (FileNotFound, …).
	FileError string `json:"file_error,omitempty"`
}

// Session describes a kept VM (GET /v1/sessions).
type Session struct {
	Name string `json:"name"`
	// VMID is its VM's, while it runs.
	VMID    string `json:"vm_id"`
	Profile string `json:"profile"`
	// Image is the image it runs in, chosen when it began.
	Image     string    `json:"image"`
	Created   time.Time `json:"created"`
	LastUsed  time.Time `json:"last_used"`
	ExpiresAt time.Time `json:"expires_at"`
	// Ends is when sessions.max_lifetime ends it, used or not.
	Ends time.Time `json:"ends,omitzero"`
	Busy bool      `json:"busy"`
	// Commands counts the commands that run in it now (at most the
	// profile's sessions.max_commands).
	Commands int `json:"commands,omitempty"`
	// State is SessionRunning or SessionPaused; a paused session has no
	// VM: PausedAt is when it was paused, DiskBytes what its saved state
	// takes in vmgated's state directory.
	State     string    `json:"state"`
	PausedAt  time.Time `json:"paused_at,omitzero"`
	DiskBytes int64     `json:"disk_bytes,omitempty"`
	// Parent names the session it was forked from.
	Parent string `json:"parent,omitempty"`
	// Published lists its published ports: "HOST->GUESTPORT".
	Published []string `json:"published,omitempty"`
	// NetLock is the session's network lock, when it is locked.
	NetLock *NetLimit `json:"net_lock,omitempty"`
	// Owner is the session's caller, in a status report.
	Owner string `json:"owner,omitempty"`
}

// Session states.
const (
	SessionRunning = "running"
	SessionPaused  = "paused"
)

// ForkRequest is the body of POST /v1/sessions/{name}/fork: the names of
// the new sessions, each a copy of the session's state at the fork.
type ForkRequest struct {
	Names []string `json:"names"`
}

// MaxForks bounds the copies one fork makes.
const MaxForks = 64

// Publishing a session's port on the host (docs/protocol.md): POST
// /v1/sessions/{name}/publish with a PublishRequest body and "Upgrade:
// vmgate-publish/1"; after 101 the client sends one byte carrying its
// listening socket (SCM_RIGHTS), and the daemon answers with frames: a
// Published 'r' frame (State PublishForwarding) once it forwards, then a
// last one (State PublishEnded, with Why), or an Error 'x' frame.
// Closing the connection ends the forward.
const (
	PublishUpgrade    = "vmgate-publish/1"
	PublishForwarding = "forwarding"
	PublishEnded      = "ended"
	// MaxPublished bounds the published ports of one session.
	MaxPublished = 16
)

// PublishRequest is the body of POST /v1/sessions/{name}/publish.
type PublishRequest struct {
	GuestPort int `json:"guest_port"`
}

// Published describes a published port: the host address as the
// listening socket is bound (a TCP address or a Unix socket's path), the
// guest port, the connections it carries at once; and, ended, why.
type Published struct {
	State     string `json:"state"`
	Session   string `json:"session"`
	Host      string `json:"host"`
	GuestPort int    `json:"guest_port"`
	MaxConns  int    `json:"max_conns,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	Why       string `json:"why,omitempty"`
}

// Status is the answer of GET /v1/status. VMs and Sessions are the
// caller's own, or everyone's when All is set (the caller's profile has
// admin = true).
type Status struct {
	Version string `json:"version"`
	LiveVMs int    `json:"live_vms"`
	MaxVMs  int    `json:"max_vms"`
	Waiting int    `json:"waiting"`
	Audit   string `json:"audit"`
	Policy  string `json:"policy"`
	// PolicyError says why the last reload failed (the old policy is in
	// force), empty when it did not.
	PolicyError string `json:"policy_error,omitempty"`
	// AuditSeq and AuditHead are the audit chain's last record: compare
	// them with the newest file to notice a truncation.
	AuditSeq  uint64 `json:"audit_seq"`
	AuditHead string `json:"audit_head"`
	// ReceiptKey is the fingerprint of the key that signs receipts and
	// the audit chain's checkpoints, ReceiptPublicKey its public half
	// (PEM).
	ReceiptKey       string `json:"receipt_key,omitempty"`
	ReceiptPublicKey string `json:"receipt_public_key,omitempty"`
	// Caller is what the asking caller's profile grants it (nil: no
	// profile takes it).
	Caller                   *Grant     `json:"caller,omitempty"`
	Pools                    []Pool     `json:"pools"`
	RestoreHandshakeFailures int64      `json:"restore_handshake_failures"`
	All                      bool       `json:"all"`
	VMs                      []LiveExec `json:"vms"`
	Sessions                 []Session  `json:"sessions"`
}

// Grant is what a caller's profile grants it, in a status report: so
// that a front end (vm-exec mcp's tool annotations) can say whether its
// commands reach a network before it runs one.
type Grant struct {
	Profile string `json:"profile"`
	// Image is the image of its commands that name none; Images the
	// images it may name (--image), Image first.
	Image    string   `json:"image"`
	Images   []string `json:"images"`
	Shell    bool     `json:"shell"`    // shell strings (-c) allowed
	Sessions bool     `json:"sessions"` // sessions allowed
	// Network says whether its VMs have a network; Allow lists that
	// network's rules (network.allow).
	Network bool     `json:"network"`
	Allow   []string `json:"allow,omitempty"`
}

// Rotation is the answer to POST /v1/audit/rotate: where the old file
// went, and the chain's last record (the new file continues after it).
type Rotation struct {
	RotatedTo string `json:"rotated_to"`
	Seq       uint64 `json:"seq"`
	Head      string `json:"head"`
}

// Pool is one VM shape's template and pool.
type Pool struct {
	Image     string `json:"image"`
	MemoryMiB int    `json:"memory_mib"`
	CPUs      int    `json:"cpus"`
	DiskMiB   int    `json:"disk_mib"`
	Seccomp   string `json:"seccomp"`
	Network   bool   `json:"network"`
	Ready     int    `json:"ready"`
	Size      int    `json:"size"`
	Hits      int64  `json:"hits"`
	Misses    int64  `json:"misses"`
	Restored  int64  `json:"restored"`
	Failures  int64  `json:"failures"`
	Shrunk    int64  `json:"shrunk"`
	// Ahead clones launched ahead wait now (QEMU up, no state loaded), of
	// AheadSize kept; AheadUsed restores completed one, AheadFailed of
	// them failed and were replaced by a new restore.
	Ahead                    int   `json:"ahead"`
	AheadSize                int   `json:"ahead_size"`
	AheadUsed                int64 `json:"ahead_used"`
	AheadFailed              int64 `json:"ahead_failed"`
	RestoreHandshakeFailures int64 `json:"restore_handshake_failures"`
}

// LiveExec is a command running now.
type LiveExec struct {
	RequestID string    `json:"request_id"`
	VMID      string    `json:"vm_id"`
	Profile   string    `json:"profile"`
	Caller    string    `json:"caller"` // "uid 1000 (alice)" or "ssh SHA256:…"
	Argv      []string  `json:"argv"`
	Session   string    `json:"session,omitempty"`
	VMStart   string    `json:"vm_start,omitempty"` // boot, restore, pool; empty in a session's later commands
	Started   time.Time `json:"started"`
}

// WriteFrame writes one frame.
func WriteFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("write frame: payload of %d bytes exceeds %d", len(payload), MaxFrame)
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	if _, err := w.Write(append(hdr[:], payload...)); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// ErrFrameTooLarge reports a frame whose declared length exceeds MaxFrame.
var ErrFrameTooLarge = errors.New("frame too large")

// ReadFrame reads one frame. The payload is freshly allocated.
func ReadFrame(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("read frame: %w: %d bytes", ErrFrameTooLarge, n)
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, fmt.Errorf("read frame: %w", io.ErrUnexpectedEOF)
	}
	return hdr[0], p, nil
}

// WriteJSONFrame marshals v into a frame of type typ.
func WriteJSONFrame(w io.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return WriteFrame(w, typ, b)
}

// checkTransfers checks the shape of a request's puts and gets.
func checkTransfers(req *ExecRequest) error {
	if n := len(req.Put) + len(req.Get); n > MaxTransfers {
		return fmt.Errorf("%d transfers; the limit is %d", n, MaxTransfers)
	}
	guestOK := func(p string) bool {
		return p != "" && len(p) <= maxGuestPath && strings.IndexByte(p, 0) < 0
	}
	for i, p := range req.Put {
		switch {
		case !guestOK(p.Guest):
			return fmt.Errorf("put %d: guest path empty, over %d bytes or holding a NUL", i, maxGuestPath)
		case !transfer.ValidTop(p.Top):
			return fmt.Errorf("put %d: top %q is not one path element", i, p.Top)
		case p.Files < 1 || p.Bytes < 0:
			return fmt.Errorf("put %d: %d files and %d bytes declared", i, p.Files, p.Bytes)
		case len(p.Local) > maxGuestPath:
			return fmt.Errorf("put %d: local path over %d bytes", i, maxGuestPath)
		}
	}
	for i, g := range req.Get {
		switch {
		case !guestOK(g.Guest):
			return fmt.Errorf("get %d: guest path empty, over %d bytes or holding a NUL", i, maxGuestPath)
		case GetTop(g.Guest) == "":
			return fmt.Errorf("get %d: %q names no file or directory to copy", i, g.Guest)
		case len(g.Local) > maxGuestPath:
			return fmt.Errorf("get %d: local path over %d bytes", i, maxGuestPath)
		}
	}
	return nil
}

// execRequestBody is an ExecRequest as DecodeExecRequest reads it: argv
// and env are taken raw (these fields are shallower than the embedded
// ones, so they win) and decoded apart, so that an error names its field.
type execRequestBody struct {
	execRequestFields
	Argv json.RawMessage `json:"argv"`
	Env  json.RawMessage `json:"env"`
}

// execRequestFields is ExecRequest without its methods.
type execRequestFields ExecRequest

// DecodeExecRequest parses and checks an exec request body strictly:
// unknown fields, trailing data and structurally invalid requests are
// errors. Policy decides everything else.
func DecodeExecRequest(r io.Reader) (*ExecRequest, error) {
	dec := json.NewDecoder(io.LimitReader(r, MaxRequestBody+1))
	dec.DisallowUnknownFields()
	var body execRequestBody
	if err := dec.Decode(&body); err != nil {
		return nil, fmt.Errorf("exec request: %w", err)
	}
	if dec.More() {
		return nil, errors.New("exec request: trailing data after the JSON object")
	}
	if dec.InputOffset() > MaxRequestBody {
		return nil, fmt.Errorf("exec request: body exceeds %d bytes", MaxRequestBody)
	}
	req := ExecRequest(body.execRequestFields)
	for _, f := range []struct {
		name string
		raw  json.RawMessage
		to   *bytestr.List
	}{{"argv", body.Argv, &req.Argv}, {"env", body.Env, &req.Env}} {
		if f.raw == nil {
			continue
		}
		if err := json.Unmarshal(f.raw, f.to); err != nil {
			return nil, fmt.Errorf("exec request: %s: %w", f.name, err)
		}
	}
	if err := checkTransfers(&req); err != nil {
		return nil, fmt.Errorf("exec request: %w", err)
	}
	if len(req.Argv) == 0 && !req.TransferOnly() {
		return nil, errors.New("exec request: argv is empty")
	}
	if req.TransferOnly() && (req.Session == "" || req.Shell || req.TTY != nil || req.Stdin) {
		return nil, errors.New("exec request: a request without argv copies files in a session, with no shell, tty or stdin")
	}
	if req.Shell && len(req.Argv) != 1 {
		return nil, errors.New("exec request: a shell request carries exactly one string")
	}
	if req.Login && !req.Shell {
		return nil, errors.New("exec request: login goes with a shell string (shell)")
	}
	if req.TimeoutMS < 0 {
		return nil, errors.New("exec request: negative timeout")
	}
	if t := req.TTY; t != nil {
		if !tty.SizeOK(t.Cols, t.Rows) || !tty.NameOK(t.Term) {
			return nil, errors.New("exec request: unreasonable tty size or terminal name")
		}
	}
	if req.User != "" && !names.Account(req.User) {
		return nil, fmt.Errorf("exec request: user %q: must be %s", req.User, names.AccountRule)
	}
	if req.Image != "" && !names.Image(req.Image) {
		return nil, fmt.Errorf("exec request: image %q: must be %s", req.Image, names.ImageRule)
	}
	if len(req.Secrets) > 256 {
		return nil, errors.New("exec request: more than 256 secrets")
	}
	for _, n := range req.Secrets {
		if !names.EnvVar(n) {
			return nil, fmt.Errorf("exec request: secret %q: must be %s", n, names.EnvVarRule)
		}
	}
	strs := append(append(append([]string{req.Dir, req.Session}, req.Argv...), req.Env...), req.Secrets...)
	if req.Net != nil {
		strs = append(strs, req.Net.Allow...)
	}
	for _, s := range strs {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, errors.New("exec request: NUL byte in a string")
		}
	}
	return &req, nil
}
