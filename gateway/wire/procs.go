package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/signum"
)

// Background processes of a session (vm-exec --session S --detach, and
// --procs, --logs, --attach, --kill, --wait). A process outlives the
// client that started it; the guest agent keeps it and its output, so a
// pause, a resume, a fork and a daemon's restart carry it. A process is
// named by its handle, the agent's number for it in its session (not its
// pid).
//
//	POST /v1/sessions/{name}/procs              an ExecRequest → Proc (started)
//	GET  /v1/sessions/{name}/procs              → []Proc
//	GET  /v1/sessions/{name}/procs/{h}/logs     ?since=N&max=N&follow=1 → ProcOutput lines (JSON, one per line)
//	POST /v1/sessions/{name}/procs/{h}/input    ProcInput → 204
//	POST /v1/sessions/{name}/procs/{h}/signal   ProcSignal → 204
//	POST /v1/sessions/{name}/procs/{h}/wait     ?timeout_ms=N → Proc (once it ended, or when the wait's time is over)

// Process states (Proc.State).
const (
	ProcRunning = "running"
	ProcExited  = "exited"
)

// Proc is a background process of a session.
type Proc struct {
	Handle int64    `json:"handle"`
	PID    int      `json:"pid"`
	Argv   []string `json:"argv"`
	User   string   `json:"user"`
	Dir    string   `json:"dir,omitempty"`
	State  string   `json:"state"`
	// ExitCode and Signal say how it ended (ExitCode is set for an exit,
	// Signal for a signal); TimedOut that its time limit ended it.
	ExitCode *int   `json:"exit_code,omitempty"`
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// Started, and Ended once it has.
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"`
	// StdoutBytes and StderrBytes count what it wrote in all;
	// StdoutDropped and StderrDropped what its buffers no longer hold
	// (sessions.process_buffer per stream).
	StdoutBytes   int64 `json:"stdout_bytes"`
	StderrBytes   int64 `json:"stderr_bytes"`
	StdoutDropped int64 `json:"stdout_dropped,omitempty"`
	StderrDropped int64 `json:"stderr_dropped,omitempty"`
	// Next is the offset of its next byte of output (both streams, in the
	// order they came): where a reader that has all goes on (--since).
	Next int64 `json:"next"`
	// StdinOpen: its input takes POST …/input until closed.
	StdinOpen bool `json:"stdin_open,omitempty"`
}

// ExitStatus is how vm-exec exits for the process once it ended (as for
// a command: its code, 128+N for signal N); ok is false while it runs.
func (p Proc) ExitStatus() (code int, ok bool) {
	switch {
	case p.State != ProcExited:
		return 0, false
	case p.Signal != "":
		return signum.ExitCode(p.Signal), true
	case p.ExitCode != nil:
		return *p.ExitCode, true
	}
	return 0, true
}

// Output streams (ProcChunk.Stream).
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// ProcOutput is one page of a process's output: its chunks from the
// offset asked for, each of one stream, in the order the process wrote
// them; Next is where the next page starts; Dropped counts the bytes
// between the offset asked for and the first chunk that its buffers no
// longer hold. Proc is the process as it is now.
type ProcOutput struct {
	Chunks  []ProcChunk `json:"chunks"`
	Next    int64       `json:"next"`
	Dropped int64       `json:"dropped,omitempty"`
	Proc    Proc        `json:"proc"`
}

// ProcChunk is a run of one stream's output at Offset.
type ProcChunk struct {
	Stream string `json:"stream"`
	Offset int64  `json:"offset"`
	Data   []byte `json:"data"`
}

// ProcInput is the body of POST …/input: Data to the process's input,
// then, with EOF, its input closed.
type ProcInput struct {
	Data []byte `json:"data,omitempty"`
	EOF  bool   `json:"eof,omitempty"`
}

// ProcSignal is the body of POST …/signal: a signal name ("TERM", "KILL",
// "INT", …; SIG prefix allowed) for the process's whole process group.
type ProcSignal struct {
	Signal string `json:"signal"`
}

// MaxProcInput bounds ProcInput.Data.
const MaxProcInput = 1 << 20

// DecodeProcInput parses a ProcInput body strictly.
func DecodeProcInput(r io.Reader) (*ProcInput, error) {
	var in ProcInput
	if err := decodeStrict(r, MaxProcInput*2, &in); err != nil {
		return nil, fmt.Errorf("process input: %w", err)
	}
	if len(in.Data) > MaxProcInput {
		return nil, fmt.Errorf("process input: %d bytes, more than %d at once", len(in.Data), MaxProcInput)
	}
	return &in, nil
}

// DecodeProcSignal parses a ProcSignal body strictly; the signal must be
// one vmgate delivers.
func DecodeProcSignal(r io.Reader) (*ProcSignal, error) {
	var s ProcSignal
	if err := decodeStrict(r, 4096, &s); err != nil {
		return nil, fmt.Errorf("process signal: %w", err)
	}
	name := strings.TrimPrefix(strings.ToUpper(s.Signal), "SIG")
	if _, ok := signum.Number(name); !ok {
		return nil, fmt.Errorf("process signal: %q is not a Linux signal name", s.Signal)
	}
	s.Signal = name
	return &s, nil
}

// decodeStrict decodes one JSON object of at most limit bytes into v:
// unknown fields and trailing data are errors.
func decodeStrict(r io.Reader, limit int64, v any) error {
	dec := json.NewDecoder(io.LimitReader(r, limit+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	if dec.InputOffset() > limit {
		return fmt.Errorf("body exceeds %d bytes", limit)
	}
	return nil
}
