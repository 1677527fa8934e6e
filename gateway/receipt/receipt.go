package receipt

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"
)

// Format is the document format this package writes and reads.
const Format = 1

// SignedPrefix precedes the body in the signed message: it keeps a
// receipt's signature from being taken for any other message of the same
// key (the audit chain's checkpoints sign under their own prefix).
const SignedPrefix = "vmgate-receipt-v1\n"

// MaxSize bounds a receipt document; Parse refuses larger ones.
const MaxSize = 1 << 20

// EmptySHA256 is the hex SHA-256 of no bytes: the hash of an empty stream.
const EmptySHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// Errors of Verify, matched with errors.Is. Each comes wrapped in a
// message that says what failed.
var (
	// ErrMalformed: not a receipt document (JSON, fields, sizes).
	ErrMalformed = errors.New("malformed receipt")
	// ErrSignature: the signature does not match the body under its key:
	// the body changed after signing, or the signature is another's.
	ErrSignature = errors.New("bad receipt signature")
	// ErrKey: the body names a key that is none of the given ones.
	ErrKey = errors.New("receipt signed by an unknown key")
)

// Verdicts of a receipt.
const (
	VerdictAllow = "allow"
	VerdictDeny  = "deny"
)

// Body is what a receipt says. The daemon fills it in; Sign sets Key.
// Times are UTC. A field that does not apply is empty (omitted), except
// the streams and the network, which are always there.
type Body struct {
	// Key is the Fingerprint of the signing key.
	Key string `json:"key"`
	// RequestID is the request's id, as in the audit log and the result.
	RequestID string `json:"request_id"`
	// Caller is who asked.
	Caller Caller `json:"caller"`
	// Verdict is the policy's decision, allow or deny, with the rule that
	// decided and its reason.
	Verdict string `json:"verdict"`
	Rule    string `json:"rule,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Profile is the policy profile the request ran (or was refused)
	// under; Policy the policy file.
	Profile string `json:"profile,omitempty"`
	Policy  Policy `json:"policy"`
	// Image is the guest image, with the SHA-256 of its base disk.
	Image *Image `json:"image,omitempty"`
	// Argv is the command exactly as decided and run (for a shell
	// string: sh -c STRING).
	Argv    []Arg  `json:"argv"`
	Shell   bool   `json:"shell,omitempty"`
	Session string `json:"session,omitempty"`
	// EnvNames are the names, never the values, of the environment the
	// request set; Dir its working directory; TTY whether it had a
	// terminal.
	EnvNames []string `json:"env_names,omitempty"`
	Dir      string   `json:"dir,omitempty"`
	TTY      bool     `json:"tty,omitempty"`
	// GuestUser is the guest account the command ran as (allowed).
	GuestUser string `json:"guest_user,omitempty"`
	// VMID is the VM that ran it.
	VMID string `json:"vm_id,omitempty"`
	// Start is when the daemon took the request in, End when it signed
	// the receipt.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// ExitCode is the command's exit status, nil when it did not exit
	// (refused, failed, killed before its status was known); Signal names
	// the signal that killed it; TimedOut says its time limit did.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// OutputTruncated says the policy's output limit cut stdout or
	// stderr: the streams below are what was relayed.
	OutputTruncated bool `json:"output_truncated,omitempty"`
	// Error says why the command did not run or complete.
	Error string `json:"error,omitempty"`
	// The streams as the daemon relayed them: stdin as the command read
	// it, stdout and stderr as sent to the caller.
	Stdin  Stream `json:"stdin"`
	Stdout Stream `json:"stdout"`
	Stderr Stream `json:"stderr"`
	// Transfers are the files copied in (put) and out (get), in order.
	Transfers []Transfer `json:"transfers,omitempty"`
	// Network is the guest network's verdict and what the guest did with it.
	Network Network `json:"network"`
	// Audit locates the request's audit record (its exec record; for a
	// refusal its decision record) in the chain; nil when it has none of
	// its own, and AuditNote says why.
	Audit     *AuditRef `json:"audit,omitempty"`
	AuditNote string    `json:"audit_note,omitempty"`
}

// Caller is a request's identity: the SO_PEERCRED uid, gid and pid of a
// local caller (with its user name), or an SSH key's fingerprint.
type Caller struct {
	UID    *uint32 `json:"uid,omitempty"`
	GID    *uint32 `json:"gid,omitempty"`
	PID    int32   `json:"pid,omitempty"`
	User   string  `json:"user,omitempty"`
	SSHKey string  `json:"ssh_key,omitempty"`
	E2BKey string  `json:"e2b_key,omitempty"`
}

// Policy names the policy that decided: its file and the SHA-256 of its
// text (sha256sum of the file gives it).
type Policy struct {
	Source string `json:"source"`
	SHA256 string `json:"sha256"`
}

// Image names a guest image and the SHA-256 of its base disk.
type Image struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256,omitempty"`
	// ManifestDigest is the manifest digest ("sha256:…") of the
	// container image it was imported or pulled from, if any: what a
	// registry and a policy's pin name.
	ManifestDigest string `json:"manifest_digest,omitempty"`
}

// Stream is the byte count and hex SHA-256 of one stream.
type Stream struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Transfer is one tree copied into the guest (put) or out of it (get):
// the SHA-256 of its tar stream as relayed and, for one regular file, of
// its content; Error when it failed.
type Transfer struct {
	Direction  string `json:"direction"`
	Guest      string `json:"guest"`
	Files      int    `json:"files"`
	Bytes      int64  `json:"bytes"`
	SHA256     string `json:"sha256,omitempty"`
	FileSHA256 string `json:"file_sha256,omitempty"`
	Error      string `json:"error,omitempty"`
}

// Network is the guest network of the request: Mode "none" (no NIC) or
// "allowlist" with its rules, and a summary of the guest's DNS queries
// and connections while the request ran, as the audit log records them.
type Network struct {
	Mode  string   `json:"mode"`
	Allow []string `json:"allow,omitempty"`
	// Narrowed says what narrowed Allow below the profile's rules:
	// "request" (vm-exec --no-network, --net-allow), "session lock"
	// (vm-exec --net-lock); with no rules left, nothing was allowed.
	Narrowed []string `json:"narrowed,omitempty"`
	// Connections and Refused count allowed and refused connections (TCP
	// and UDP), DNS the queries answered or refused.
	Connections int `json:"connections,omitempty"`
	Refused     int `json:"refused,omitempty"`
	DNS         int `json:"dns,omitempty"`
	// Destinations lists distinct destinations (at most MaxDestinations),
	// Omitted counts the rest.
	Destinations []Destination `json:"destinations,omitempty"`
	Omitted      int           `json:"destinations_omitted,omitempty"`
}

// MaxDestinations bounds Network.Destinations.
const MaxDestinations = 32

// Destination is one destination of the guest's traffic and what was
// decided for it.
type Destination struct {
	Proto   string `json:"proto"`
	Name    string `json:"name,omitempty"`
	Addr    string `json:"addr,omitempty"`
	Port    uint16 `json:"port,omitempty"`
	Allowed bool   `json:"allowed"`
	Count   int    `json:"count"`
	Reason  string `json:"reason,omitempty"`
}

// AuditRef locates a record in the audit chain: its sequence number and
// the hex SHA-256 of its line (the chain head right after it), and the
// chain head when the receipt was signed (HeadSeq ≥ Seq: other requests'
// records may have followed).
type AuditRef struct {
	Seq     uint64 `json:"seq"`
	Hash    string `json:"hash"`
	HeadSeq uint64 `json:"head_seq"`
	Head    string `json:"head"`
}

// Document is a receipt as written: the body exactly as signed.
type Document struct {
	Receipt int             `json:"vmgate_receipt"`
	Body    json.RawMessage `json:"body"`
	Sig     string          `json:"sig"`
}

// Sign sets b.Key to key's fingerprint and returns the signed document,
// compact JSON without a trailing newline.
func Sign(key ed25519.PrivateKey, b *Body) ([]byte, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("receipt: sign: not an ed25519 private key")
	}
	b.Key = Fingerprint(key.Public().(ed25519.PublicKey))
	body, err := json.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("receipt: sign: %w", err)
	}
	sig := ed25519.Sign(key, signed(body))
	return json.Marshal(Document{Receipt: Format, Body: body, Sig: base64.StdEncoding.EncodeToString(sig)})
}

// signed is the message a body's signature covers.
func signed(body []byte) []byte {
	return append([]byte(SignedPrefix), body...)
}

// Parse reads a receipt document strictly (unknown fields, trailing data,
// a wrong format number, a document over MaxSize are errors wrapping
// ErrMalformed) and decodes its body, without checking the signature.
func Parse(doc []byte) (*Document, *Body, error) {
	if len(doc) > MaxSize {
		return nil, nil, fmt.Errorf("%w: %d bytes, the limit is %d", ErrMalformed, len(doc), MaxSize)
	}
	var d Document
	if err := strict(doc, &d); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if d.Receipt != Format {
		return nil, nil, fmt.Errorf("%w: vmgate_receipt is %d, want %d", ErrMalformed, d.Receipt, Format)
	}
	if len(d.Body) == 0 || d.Sig == "" {
		return nil, nil, fmt.Errorf("%w: no body or no sig", ErrMalformed)
	}
	var b Body
	if err := strict(d.Body, &b); err != nil {
		return nil, nil, fmt.Errorf("%w: body: %w", ErrMalformed, err)
	}
	return &d, &b, nil
}

// strict decodes one JSON value into v: unknown fields and trailing data
// are errors.
func strict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// Verify parses doc and checks its signature under one of keys; it
// returns the body. Errors wrap ErrMalformed, ErrKey or ErrSignature and
// say what failed.
func Verify(doc []byte, keys ...ed25519.PublicKey) (*Body, error) {
	d, b, err := Parse(doc)
	if err != nil {
		return nil, err
	}
	sig, err := base64.StdEncoding.Strict().DecodeString(d.Sig)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, fmt.Errorf("%w: sig is not a base64 ed25519 signature", ErrMalformed)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no key to verify against", ErrKey)
	}
	msg := signed(d.Body)
	var named ed25519.PublicKey
	for _, k := range keys {
		if Fingerprint(k) == b.Key {
			named = k
		}
	}
	if named == nil {
		// A changed key field lands here too: the signature covers it,
		// so no key would verify the body.
		return nil, fmt.Errorf("%w: it names key %s, not %s: another daemon's key signed it (or its key field was changed)", ErrKey, b.Key, fingerprints(keys))
	}
	if !ed25519.Verify(named, msg, sig) {
		return nil, fmt.Errorf("%w: the signature does not match the body under key %s: the body was changed after signing, or the signature is another receipt's", ErrSignature, b.Key)
	}
	return b, nil
}

func fingerprints(keys []ed25519.PublicKey) string {
	var b bytes.Buffer
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" or ")
		}
		b.WriteString(Fingerprint(k))
	}
	return b.String()
}

// Arg is one argument of a command, as bytes. It encodes as a JSON string
// when the bytes are valid UTF-8, else as {"base64":"…"}, so that any
// bytes survive (encoding/json would turn invalid UTF-8 into U+FFFD).
type Arg string

// ArgvOf is argv as receipt arguments: the one place that maps the wire's
// argv to the receipt's, so that a wire carrying other bytes than UTF-8
// strings changes only this.
func ArgvOf(argv []string) []Arg {
	out := make([]Arg, len(argv))
	for i, a := range argv {
		out[i] = Arg(a)
	}
	return out
}

type argB64 struct {
	Base64 string `json:"base64"`
}

// MarshalJSON implements json.Marshaler.
func (a Arg) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(a)) {
		return json.Marshal(string(a))
	}
	return json.Marshal(argB64{base64.StdEncoding.EncodeToString([]byte(a))})
}

// UnmarshalJSON implements json.Unmarshaler: a string, or an object with
// base64 of bytes that are not valid UTF-8 (valid UTF-8 in base64 is
// refused: each argument has one encoding).
func (a *Arg) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*a = Arg(s)
		return nil
	}
	var o argB64
	if err := strict(data, &o); err != nil {
		return fmt.Errorf("argument: %w", err)
	}
	b, err := base64.StdEncoding.Strict().DecodeString(o.Base64)
	if err != nil {
		return fmt.Errorf("argument: %w", err)
	}
	if utf8.Valid(b) {
		return errors.New("argument: base64 of valid UTF-8 (it is written as a string)")
	}
	*a = Arg(b)
	return nil
}

// StreamOf is the Stream of data.
func StreamOf(data []byte) Stream {
	sum := sha256.Sum256(data)
	return Stream{Bytes: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}
}
