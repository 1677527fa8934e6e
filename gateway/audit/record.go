package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/internal/bytestr"
)

// Kind says what a [Record] describes.
type Kind string

// The kinds of record vmgated writes.
const (
	// KindDecision records a policy decision on a request (allow or deny).
	KindDecision Kind = "decision"
	// KindExec records the outcome of a command run in a VM.
	KindExec Kind = "exec"
	// KindFile records a file operation in a session's guest (stat,
	// list, mkdir, move, remove, read, write): decision and outcome.
	KindFile Kind = "file"
	// KindSession records the start or end of an interactive session.
	KindSession Kind = "session"
	// KindNet records a guest network event: a DNS query or a connection,
	// allowed or refused (Verdict, Rule, Reason, Net).
	KindNet Kind = "net"
	// KindDaemon records a daemon event: start, stop, policy reload.
	KindDaemon Kind = "daemon"
	// KindRotate is the first record of a file that continues the chain
	// of the file before it (Log.Reopen): its Seq and Prev follow that
	// file's last record, and Predecessor names that file.
	KindRotate Kind = "rotate"
	// KindCheckpoint signs the chain up to it with the daemon's key
	// (checkpoint.go); only the Log writes it.
	KindCheckpoint Kind = "checkpoint"
)

func (k Kind) valid() bool {
	switch k {
	case KindDecision, KindExec, KindFile, KindSession, KindDaemon, KindNet, KindRotate, KindCheckpoint:
		return true
	}
	return false
}

// Verdict is the outcome of a policy decision.
type Verdict string

// The verdicts of a [KindDecision] record.
const (
	VerdictAllow Verdict = "allow"
	VerdictDeny  Verdict = "deny"
)

// Redacted replaces every argv element that matches one of
// [Options.Redact].
const Redacted = "[REDACTED]"

// GenesisPrev is the Prev of the first line of every log file: the hex
// SHA-256 of the empty string.
const GenesisPrev = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// MaxLineSize bounds one encoded record, newline included. [Log.Write]
// refuses larger records and [Verify] treats a longer line as corruption.
// It leaves room for a maximal Linux argv (ARG_MAX, 2 MiB by default) after
// JSON escaping.
const MaxLineSize = 8 << 20

// Record is one line of the audit log. Time, Seq and Prev are set by
// [Log.Write]; the caller fills in the rest. Pointer fields distinguish
// "not applicable" (nil, omitted) from a zero value such as uid 0 or exit
// code 0; with Go 1.26 write them as new(uint32(uid)).
//
// Argv and EnvNames keep every byte: an element that is not valid UTF-8
// is written {"b64": "…"} (package bytestr), text as a JSON string, as it
// always was; an element abridged for its length is text, whose mark
// holds the SHA-256 of its full bytes. Other strings are encoded by
// encoding/json, which replaces invalid UTF-8 with U+FFFD.
type Record struct {
	// Time is when the record was written, in UTC (RFC 3339 with nanoseconds).
	Time time.Time `json:"time"`
	// Seq numbers the records of one file from 1, without gaps.
	Seq uint64 `json:"seq"`
	// Kind says what the record describes.
	Kind Kind `json:"kind"`

	// RequestID ties the records of one API request together.
	RequestID string `json:"request_id,omitempty"`
	// UID, GID and PID are the client's SO_PEERCRED identity.
	UID *uint32 `json:"uid,omitempty"`
	GID *uint32 `json:"gid,omitempty"`
	PID int32   `json:"pid,omitempty"`
	// User is the client's user name, if resolved.
	User string `json:"user,omitempty"`
	// SSH identifies a client of a front door that knows its callers by
	// key (the SSH door, or the E2B door: SSHClient.Door); such a client
	// has no UID, GID, PID or User.
	SSH *SSHClient `json:"ssh,omitempty"`
	// Profile is the policy profile the request ran under.
	Profile string `json:"profile,omitempty"`
	// Argv is the command, after redaction.
	Argv bytestr.List `json:"argv,omitempty"`
	// Shell is set when Argv is run through the guest's shell.
	Shell bool `json:"shell,omitempty"`
	// Session identifies an interactive session.
	Session string `json:"session,omitempty"`
	// EnvNames are the names (never the values) of the environment
	// variables the request asked for; Dir its working directory; TTY is
	// set when it asked for a terminal.
	EnvNames bytestr.List `json:"env_names,omitempty"`
	// Secrets are the names (never the values or placeholders) of the
	// secrets the command was given.
	Secrets []string `json:"secrets,omitempty"`
	Dir     string   `json:"dir,omitempty"`
	TTY     bool     `json:"tty,omitempty"`
	// GuestUser is the guest account the command ran (or was to run) as.
	GuestUser string `json:"guest_user,omitempty"`
	// Process is the handle of a session's background process the
	// record is of (its start, its end, an operation on it).
	Process int64 `json:"process,omitempty"`
	// File is the file operation a KindFile record is of.
	File *FileOp `json:"file,omitempty"`

	// Verdict, Rule and Reason describe a policy decision.
	Verdict Verdict `json:"verdict,omitempty"`
	Rule    string  `json:"rule,omitempty"`
	Reason  string  `json:"reason,omitempty"`

	// VMID, Image and ImageDigest identify the VM and the image it
	// booted (its name, profile.image or another of images, and its
	// base's SHA-256); ImageManifestDigest is the manifest digest of the
	// container image it was imported or pulled from ("sha256:…"), if
	// any.
	VMID                string `json:"vm_id,omitempty"`
	Image               string `json:"image,omitempty"`
	ImageDigest         string `json:"image_digest,omitempty"`
	ImageManifestDigest string `json:"image_manifest_digest,omitempty"`

	// ExitCode is the command's exit status; nil if it did not exit.
	ExitCode *int `json:"exit_code,omitempty"`
	// Signal names the signal that killed the command, e.g. "SIGKILL".
	Signal string `json:"signal,omitempty"`
	// TimedOut is set when the command was killed at its deadline.
	TimedOut bool `json:"timed_out,omitempty"`
	// The byte counts and hashes of the command's streams.
	StdoutBytes  int64  `json:"stdout_bytes,omitempty"`
	StderrBytes  int64  `json:"stderr_bytes,omitempty"`
	StdinBytes   int64  `json:"stdin_bytes,omitempty"`
	StdoutSHA256 string `json:"stdout_sha256,omitempty"`
	StderrSHA256 string `json:"stderr_sha256,omitempty"`
	StdinSHA256  string `json:"stdin_sha256,omitempty"`
	// Truncated is set when output was cut at the configured limit.
	Truncated bool `json:"truncated,omitempty"`
	// DurationMS is the command's run time, BootMS the VM's boot time.
	DurationMS int64 `json:"duration_ms,omitempty"`
	BootMS     int64 `json:"boot_ms,omitempty"`
	// VMStart says how the VM came to be: "boot" (cold boot), "restore"
	// (restored from a template for this request) or "pool" (restored
	// earlier and waiting in the pool); BootMS is that step's time.
	VMStart string `json:"vm_start,omitempty"`
	// DiskBytes is what the VM's disk (its overlay file) took on the
	// host's disk when the command ended: what the guest wrote, bounded by
	// the profile's disk_mib. Records written before it existed lack it.
	DiskBytes int64 `json:"disk_bytes,omitempty"`

	// Snapshot is the digest of a session's saved state (a pause, a
	// resume, a fork: package vm's save points), SnapshotBytes the disk
	// it takes; Parent names the session a new one was forked from, and
	// Children the sessions a fork made.
	Snapshot      string   `json:"snapshot,omitempty"`
	SnapshotBytes int64    `json:"snapshot_bytes,omitempty"`
	Parent        string   `json:"parent,omitempty"`
	Children      []string `json:"children,omitempty"`

	// Net describes a KindNet event.
	Net *NetEvent `json:"net,omitempty"`
	// Network is the guest network a request's verdict gave it (its
	// decision and exec records), when its VM has a NIC.
	Network *NetVerdict `json:"network,omitempty"`

	// Transfers are the request's file copies: as requested in its
	// decision record, with their outcome in its exec record; at most
	// MaxTransfers of them and MaxTransfersBytes of their strings.
	// TransfersOmitted counts those left out, the last ones.
	Transfers        []Transfer `json:"transfers,omitempty"`
	TransfersOmitted int        `json:"transfers_omitted,omitempty"`

	// Error describes a failure; Message is free text (daemon events).
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`

	// Predecessor, in a KindRotate record, names the file whose chain
	// this file continues. Logs written before it existed lack it.
	Predecessor *Predecessor `json:"predecessor,omitempty"`
	// Checkpoint is a KindCheckpoint record's signature.
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`

	// Prev is the hex SHA-256 of the previous line without its newline,
	// or GenesisPrev on the first line.
	Prev string `json:"prev"`
}

// Transfer is one tree copied into the guest ("put") or out of it
// ("get"). Files and Bytes are the client's declaration in a decision
// record and what was relayed in an exec record; the hashes are those of
// the relayed tar stream and, for a single file, of its content.
type Transfer struct {
	Direction  string `json:"direction"`
	Guest      string `json:"guest"`
	Local      string `json:"local,omitempty"`
	Files      int    `json:"files"`
	Bytes      int64  `json:"bytes"`
	SHA256     string `json:"sha256,omitempty"`
	FileSHA256 string `json:"file_sha256,omitempty"`
	Error      string `json:"error,omitempty"`
}

// encode returns r as one line, newline included.
func encode(r *Record) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// parseLine decodes one line (without its newline) as a Record.
func parseLine(line []byte) (Record, error) {
	var r Record
	if len(line) == 0 {
		return r, errors.New("empty line")
	}
	if err := json.Unmarshal(line, &r); err != nil {
		return r, fmt.Errorf("not a record: %w", err)
	}
	if r.Time.IsZero() {
		return r, errors.New("record has no time")
	}
	return r, nil
}

// lineHash is the chain hash of a line without its newline.
func lineHash(line []byte) string {
	sum := sha256.Sum256(line)
	return hex.EncodeToString(sum[:])
}

// Predecessor is the file a rotated log continues: its name, and its last
// record's Seq and hash, which the KindRotate record's Seq and Prev follow.
type Predecessor struct {
	// File is the file's base name when the log left it: the name that
	// `vmgated audit rotate` gave it, or where logrotate had moved it
	// ("" when unknown). logrotate's compress later adds ".gz".
	File    string `json:"file,omitempty"`
	LastSeq uint64 `json:"last_seq"`
	Head    string `json:"head"`
}

// NetEvent is one DNS query or connection of a guest.
//
// A connection into a published session port is Proto "forward": Addr is
// the published host address (TCP, or a Unix socket's path), Port the
// guest's, Peer the host client (its address, or a Unix socket peer's
// process and uid).
type NetEvent struct {
	Proto      string `json:"proto"` // dns, tcp, udp, forward
	Name       string `json:"name,omitempty"`
	Addr       string `json:"addr,omitempty"`
	Port       uint16 `json:"port,omitempty"`
	Peer       string `json:"peer,omitempty"`
	BytesOut   int64  `json:"bytes_out,omitempty"` // guest to the world
	BytesIn    int64  `json:"bytes_in,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	// Intercepted marks TLS the netstack terminated to put a secret in;
	// Secret and SecretPlace name a secret whose placeholder was found
	// where it may not go (a request refused), or whose value a host
	// sent back, and where ("header X-Debug", "body", "answer").
	Intercepted bool   `json:"intercepted,omitempty"`
	Secret      string `json:"secret,omitempty"`
	SecretPlace string `json:"secret_place,omitempty"`
}

// NetVerdict is the guest network a request ran with: the egress rules in
// force (empty: nothing allowed), and what narrowed them below its
// profile's ("request": vm-exec --no-network or --net-allow; "session
// lock": vm-exec --net-lock).
type NetVerdict struct {
	Allow    []string `json:"allow"`
	Narrowed []string `json:"narrowed,omitempty"`
}

// SSHClient is a client of the SSH front door, or of the E2B door.
type SSHClient struct {
	// Door is "e2b" for a client of the E2B door, empty for the SSH door.
	Door string `json:"door,omitempty"`
	// Fingerprint is the SHA-256 fingerprint of the client's key, as
	// ssh-keygen -l prints it ("SHA256:…").
	Fingerprint string `json:"fingerprint"`
	// Comment is the key's comment in the authorized-keys file.
	Comment string `json:"comment,omitempty"`
	// User is the user name the client sent (informational).
	User string `json:"user,omitempty"`
	// Remote is the client's address.
	Remote string `json:"remote,omitempty"`
}

// FileOp is a file operation in a session's guest, as its record says:
// the operation, its path (and a move's destination), and the bytes a
// read or a write moved.
type FileOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	To    string `json:"to,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
}
