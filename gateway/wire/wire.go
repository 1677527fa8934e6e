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
//	client → daemon: 'i' stdin bytes, 'e' stdin EOF, 's' signal name ("INT", "TERM")
//	daemon → client: 'o' stdout bytes, 'E' stderr bytes, 'r' Result JSON (last),
//	                 'x' Error JSON (last)
//
// Closing the connection before the final frame kills the command and its VM.
package wire

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/signum"
	"github.com/vmgate/vmgate/internal/sshmsg"
)

// DefaultSocket is the daemon's socket when none is configured; clients
// use it when neither a path nor VMGATE_SOCKET is given.
const DefaultSocket = "/run/vmgate/vmgate.sock"

var sessionNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// ValidSessionName reports whether s is an acceptable session name: 1 to 64
// of [A-Za-z0-9._-], and not "." or "..", so that it is safe as a file name
// (and as an SSH login, whose user names allow the same characters).
func ValidSessionName(s string) bool {
	return sessionNameRE.MatchString(s) && s != "." && s != ".."
}

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
	FrameStdout   byte = 'o'
	FrameStderr   byte = 'E'
	FrameResult   byte = 'r'
	FrameError    byte = 'x'
)

// ExecRequest is the body of POST /v1/exec.
type ExecRequest struct {
	// Argv is the program and its arguments. With Shell set, Argv must hold
	// exactly one element, the shell string, run as sh -c STRING.
	Argv  []string `json:"argv"`
	Shell bool     `json:"shell,omitempty"`
	// Env holds KEY=VALUE pairs the policy may pass on.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory in the guest.
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
// run it".
const (
	// ExitInternal: vmgate itself failed (bad flags, I/O error).
	ExitInternal = 200
	// ExitDenied: the policy refused the request.
	ExitDenied = 201
	// ExitBusy: no VM slot became free in time.
	ExitBusy = 202
	// ExitTimedOut: the command ran past its time limit and was killed.
	ExitTimedOut = 203
	// ExitUnreachable: the gateway socket could not be reached.
	ExitUnreachable = 204
	// ExitVMFailed: the VM could not be started or died while running.
	ExitVMFailed = 205
	// ExitUsage: the command line was invalid.
	ExitUsage = 2
)

// ExitCode is the exit code a client reports for a refusal or failure
// with this error's code.
func (e Error) ExitCode() int {
	switch e.Code {
	case CodeDenied:
		return ExitDenied
	case CodeBusy:
		return ExitBusy
	case CodeVM:
		return ExitVMFailed
	case CodeTimeout:
		return ExitTimedOut
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

// Error codes in Error.Code.
const (
	CodeBadRequest = "bad_request"
	CodeDenied     = "denied"
	CodeBusy       = "busy"
	CodeAudit      = "audit_unavailable"
	CodeVM         = "vm_failed"
	CodeTimeout    = "timed_out"
	CodeInternal   = "internal"
	CodeNotFound   = "not_found"
	CodeShutdown   = "shutting_down"
)

// Error is the JSON body of a refusal and the payload of an error frame.
type Error struct {
	Code      string `json:"code"`
	Error     string `json:"error"`
	Profile   string `json:"profile,omitempty"`
	Rule      string `json:"rule,omitempty"`
	RequestID string `json:"request_id,omitempty"`
}

// Session describes a kept VM (GET /v1/sessions).
type Session struct {
	Name      string    `json:"name"`
	VMID      string    `json:"vm_id"`
	Profile   string    `json:"profile"`
	Created   time.Time `json:"created"`
	LastUsed  time.Time `json:"last_used"`
	ExpiresAt time.Time `json:"expires_at"`
	Busy      bool      `json:"busy"`
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

// DecodeExecRequest parses and checks an exec request body strictly:
// unknown fields, trailing data and structurally invalid requests are
// errors. Policy decides everything else.
func DecodeExecRequest(r io.Reader) (*ExecRequest, error) {
	dec := json.NewDecoder(io.LimitReader(r, MaxRequestBody+1))
	dec.DisallowUnknownFields()
	var req ExecRequest
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf("exec request: %w", err)
	}
	if dec.More() {
		return nil, errors.New("exec request: trailing data after the JSON object")
	}
	if dec.InputOffset() > MaxRequestBody {
		return nil, fmt.Errorf("exec request: body exceeds %d bytes", MaxRequestBody)
	}
	if len(req.Argv) == 0 {
		return nil, errors.New("exec request: argv is empty")
	}
	if req.Shell && len(req.Argv) != 1 {
		return nil, errors.New("exec request: a shell request carries exactly one string")
	}
	if req.TimeoutMS < 0 {
		return nil, errors.New("exec request: negative timeout")
	}
	if t := req.TTY; t != nil {
		if !sshmsg.TermSizeOK(t.Cols, t.Rows) || !sshmsg.TermNameOK(t.Term) {
			return nil, errors.New("exec request: unreasonable tty size or terminal name")
		}
	}
	for _, s := range append(append([]string{req.Dir, req.Session}, req.Argv...), req.Env...) {
		if strings.IndexByte(s, 0) >= 0 {
			return nil, errors.New("exec request: NUL byte in a string")
		}
	}
	return &req, nil
}
