// Package shelltool is the exec_shell_command tool that agents are offered
// (the benchmark's openai agent, `vm-exec mcp`), with the parameters and the
// result text of llama-server's built-in tool of that name, so that a model
// prompted for one meets the same tool in the other. The difference is
// where the command runs: through vmgated, in a VM, never on the host.
//
// llama-server's tool: `command` (string, run as `sh -c`), `timeout`
// (seconds, default 10, at most 60) and `max_output_size` (bytes, default
// 16384, at most 16384); stdout and stderr combined; output beyond the limit
// dropped and marked "\n[output truncated]"; then "\n[exit code: N]", and
// " [exit due to timed out]" when the time limit killed the command (whose
// exit code is then reported as 1, as llama-server's own process runner
// does).
//
// The arguments come from a model: ParseArgs accepts what small models
// actually send (numbers as strings, floats with integral values) and
// refuses everything else with an error the model can act on.
package shelltool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// Name is the tool's name.
const Name = "exec_shell_command"

// Description is the tool's description, as llama-server words it.
const Description = "Execute a shell command and return its output (stdout and stderr combined)."

// Limits of llama-server's tool.
const (
	DefaultTimeout       = 10 * time.Second
	MaxTimeout           = 60 * time.Second
	DefaultMaxOutputSize = 16384
)

// TruncatedMarker follows output cut at the size limit.
const TruncatedMarker = "\n[output truncated]"

// Schema is the JSON schema of the tool's parameters.
func Schema() map[string]any {
	return map[string]any{
		"type": "object",
		"properties": map[string]any{
			"command": map[string]any{"type": "string", "description": "Shell command to execute"},
			"timeout": map[string]any{"type": "integer", "description": "Timeout in seconds (default 10, max 60)"},
			"max_output_size": map[string]any{"type": "integer",
				"description": fmt.Sprintf("Maximum output size in bytes (default %d)", DefaultMaxOutputSize)},
		},
		"required": []string{"command"},
	}
}

// Args are the tool's arguments after defaults and limits.
type Args struct {
	Command       string
	Timeout       time.Duration
	MaxOutputSize int
}

// ErrArgs marks arguments a model got wrong.
var ErrArgs = errors.New("invalid arguments")

// ParseArgs decodes a tool call's JSON arguments. A missing timeout or
// max_output_size takes the default; larger values are lowered to the
// limit, as llama-server does; a timeout of 0 or less means the default
// (llama-server would kill the command at once, which helps no one).
func ParseArgs(raw []byte) (Args, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return Args{}, fmt.Errorf("%w: not a JSON object: %v", ErrArgs, err)
	}
	var a Args
	cmd, ok := m["command"]
	if !ok {
		return Args{}, fmt.Errorf("%w: \"command\" is missing", ErrArgs)
	}
	if err := json.Unmarshal(cmd, &a.Command); err != nil {
		return Args{}, fmt.Errorf("%w: \"command\" must be a string", ErrArgs)
	}
	if strings.TrimSpace(a.Command) == "" {
		return Args{}, fmt.Errorf("%w: \"command\" is empty", ErrArgs)
	}
	if strings.ContainsRune(a.Command, 0) {
		return Args{}, fmt.Errorf("%w: \"command\" contains a NUL byte", ErrArgs)
	}
	a.Timeout = DefaultTimeout
	if v, ok := m["timeout"]; ok {
		n, err := integer(v)
		if err != nil {
			return Args{}, fmt.Errorf("%w: \"timeout\": %v", ErrArgs, err)
		}
		if n > 0 {
			a.Timeout = min(time.Duration(min(n, 1<<20))*time.Second, MaxTimeout)
		}
	}
	a.MaxOutputSize = DefaultMaxOutputSize
	if v, ok := m["max_output_size"]; ok {
		n, err := integer(v)
		if err != nil {
			return Args{}, fmt.Errorf("%w: \"max_output_size\": %v", ErrArgs, err)
		}
		if n > 0 {
			a.MaxOutputSize = int(min(n, DefaultMaxOutputSize))
		}
	}
	return a, nil
}

// integer accepts a JSON number with an integral value, a numeric string
// or null (0).
func integer(v json.RawMessage) (int64, error) {
	var x any
	if err := json.Unmarshal(v, &x); err != nil {
		return 0, err
	}
	switch t := x.(type) {
	case nil:
		return 0, nil
	case float64:
		if t != math.Trunc(t) || math.Abs(t) > 1<<53 {
			return 0, fmt.Errorf("%v is not an integer", t)
		}
		return int64(t), nil
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(t), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not an integer", t)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s is not an integer", v)
}

// Format renders a finished command the way llama-server does.
func Format(output []byte, truncated bool, exitCode int, timedOut bool) string {
	var b strings.Builder
	b.Write(bytes.ToValidUTF8(output, []byte("\uFFFD")))
	if truncated {
		b.WriteString(TruncatedMarker)
	}
	fmt.Fprintf(&b, "\n[exit code: %d]", exitCode)
	if timedOut {
		b.WriteString(" [exit due to timed out]")
	}
	return b.String()
}

// ExitCode maps a result to the number the tool reports: the command's
// own, 1 after a timeout (as llama-server reports it), 128+N for a command
// killed by signal N (as a shell reports it).
func ExitCode(r *wire.Result) int {
	if r.TimedOut {
		return 1
	}
	return r.ShellExitCode()
}

// Capped keeps the first Limit bytes written to it and counts the rest.
// stdout and stderr share one, so the text holds both in arrival order.
type Capped struct {
	Limit int
	mu    sync.Mutex
	buf   bytes.Buffer
	total int64
}

// Write implements io.Writer; it never fails.
func (c *Capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if room := c.Limit - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

// Bytes returns what was kept.
func (c *Capped) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

// Truncated reports whether anything was dropped.
func (c *Capped) Truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total > int64(c.buf.Len())
}

// Outcome is one run of the tool.
type Outcome struct {
	Text   string       // what the model is given
	Result *wire.Result // nil when the command never ran
	Err    error        // why it never ran (denied, busy, VM failure, …)
	// RequestID is the request's id ("" when it never reached a
	// decision); Receipt its signed receipt, checked by the client (a
	// denial's too), nil when there is none; ReceiptErr why the client
	// refused the one that came (the command's outcome stands).
	RequestID  string
	Receipt    json.RawMessage
	ReceiptErr error
}

// Run runs a through the gateway: in the named session's VM, or in a fresh
// VM when session is empty, and asks for a receipt of it. Refusals and
// failures become the text the model reads ("vmgate: …\n[exit code:
// -1]"), as llama-server reports a process that could not be spawned, and
// are also returned in Err.
func Run(ctx context.Context, c *client.Client, session string, a Args) Outcome {
	out := &Capped{Limit: a.MaxOutputSize}
	req := wire.ExecRequest{Argv: []string{a.Command}, Shell: true, Session: session, TimeoutMS: a.Timeout.Milliseconds(), Receipt: true}
	res, err := c.Exec(ctx, req, client.ExecIO{Stdout: out, Stderr: out})
	var re *client.ReceiptError
	if res != nil && errors.As(err, &re) && err == error(re) {
		// The command ran; only its receipt was refused.
		return Outcome{Text: Format(out.Bytes(), out.Truncated(), ExitCode(res), res.TimedOut), Result: res, RequestID: res.RequestID, ReceiptErr: err}
	}
	if err != nil {
		o := Outcome{Text: "vmgate: " + err.Error() + "\n[exit code: -1]", Err: err, Receipt: client.ReceiptOf(err), RequestID: client.RequestIDOf(err)}
		if errors.As(err, &re) {
			o.ReceiptErr = re
		}
		return o
	}
	return Outcome{Text: Format(out.Bytes(), out.Truncated(), ExitCode(res), res.TimedOut), Result: res, RequestID: res.RequestID, Receipt: res.Receipt}
}
