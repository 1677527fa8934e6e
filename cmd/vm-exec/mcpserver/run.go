package mcpserver

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
)

// Live output: while a command runs longer than progressDelay, and the
// client asked for progress (a progressToken in the call's _meta), the
// server sends notifications/progress every progressEvery: progress is the
// seconds since the call began (it only grows, as the specification
// requires, and the total is unknown), and message is the output that
// arrived since the previous notification. Only the bytes the result
// keeps (the first max_output_size) are streamed; after them one message
// says "[output truncated]". Output goes into a buffer that never waits
// for the client: a client that stops reading blocks the next
// notification, never the command.
const (
	progressDelay = time.Second
	progressEvery = time.Second
)

// liveOutput is a command's combined output: the first limit bytes are
// kept (for the result and the progress messages), the rest counted.
// Write never blocks on anything but its own lock.
type liveOutput struct {
	limit int

	mu     sync.Mutex
	kept   []byte
	total  int64
	sent   int  // bytes of kept already handed to take
	marked bool // the truncation mark was handed to take
}

func newLiveOutput(limit int) *liveOutput { return &liveOutput{limit: limit} }

// Write implements io.Writer; it never fails.
func (o *liveOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.total += int64(len(p))
	if room := o.limit - len(o.kept); room > 0 {
		o.kept = append(o.kept, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

// Bytes returns the kept output.
func (o *liveOutput) Bytes() []byte {
	o.mu.Lock()
	defer o.mu.Unlock()
	return bytes.Clone(o.kept)
}

// Truncated reports whether output was dropped.
func (o *liveOutput) Truncated() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.total > int64(len(o.kept))
}

// take returns the kept output not taken before, as text: a character
// cut at the end waits for its other bytes, invalid bytes become U+FFFD.
// Once the output was cut and all kept bytes were taken, it returns the
// truncation mark, once.
func (o *liveOutput) take() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	end := len(o.kept)
	full := len(o.kept) >= o.limit
	if !full {
		end = completeRunes(o.kept[o.sent:]) + o.sent
	}
	chunk := bytes.ToValidUTF8(o.kept[o.sent:end], []byte("\uFFFD"))
	o.sent = end
	if full && o.total > int64(len(o.kept)) && !o.marked {
		o.marked = true
		chunk = append(chunk, shelltool.TruncatedMarker...)
	}
	return string(chunk)
}

// completeRunes returns the length of b without an incomplete UTF-8
// sequence at its end (at most utf8.UTFMax-1 bytes held back).
func completeRunes(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}

// progress starts the notifications of a call whose client sent a
// progress token; the returned stop ends them, and returns once no
// notification is being written (none follows the result).
func (s *Server) progress(ctx context.Context, req *mcp.CallToolRequest, out *liveOutput) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	start := time.Now()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTimer(progressDelay)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			p := &mcp.ProgressNotificationParams{ProgressToken: token,
				Progress: float64(time.Since(start).Milliseconds()) / 1000, Message: out.take()}
			if err := req.Session.NotifyProgress(ctx, p); err != nil {
				s.log.Debug("progress notification not sent", "err", err)
				return
			}
			t.Reset(progressEvery)
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// ExecOutput is the structured result of exec_shell_command and
// session_exec: what the text result says, as fields. The tools'
// outputSchema is derived from it (schemaFor): its json tags name the
// properties, the ones without omitempty are required, its jsonschema
// tags describe them.
type ExecOutput struct {
	// ExitCode is the command's exit code as a shell reports it: its
	// own, or 128+N when signal N ended it (a command killed at its time
	// limit: 137). The text result says 1 after a timeout, as
	// llama-server's tool does; timed_out tells.
	ExitCode int `json:"exit_code" jsonschema:"Exit code as a shell reports it: the command's own, or 128+N when signal N ended it"`
	// Signal names the signal that ended the command ("KILL"), if any.
	Signal string `json:"signal,omitempty" jsonschema:"Signal that ended the command (KILL, TERM, …), if any"`
	// Output is stdout and stderr combined, as they arrived, cut at
	// max_output_size (bytes that are not UTF-8 shown as U+FFFD).
	Output    string `json:"output" jsonschema:"stdout and stderr combined, cut at max_output_size"`
	Truncated bool   `json:"truncated" jsonschema:"Output beyond max_output_size was dropped"`
	TimedOut  bool   `json:"timed_out" jsonschema:"The time limit killed the command"`
	// DurationMS is the command's run time in the VM; TotalMS adds the
	// wait for a VM and its start.
	DurationMS int64 `json:"duration_ms" jsonschema:"The command's run time in the VM, in milliseconds"`
	TotalMS    int64 `json:"total_ms" jsonschema:"The whole call, including the wait for a VM and its start, in milliseconds"`
	// VM is the VM's id, RequestID the gateway's id of the request (the
	// audit log's request_id).
	VM        string `json:"vm" jsonschema:"The VM's id"`
	RequestID string `json:"request_id" jsonschema:"The gateway's request id (request_id in its audit log)"`
	Session   string `json:"session,omitempty" jsonschema:"The session the command ran in, if any"`
}

// runShell runs a's command through the gateway, in session's VM or a
// fresh one (of c's image and with its secrets), with live output, and returns the tool's result: the text
// of llama-server's tool as the content, ExecOutput as the structured
// content. Cancelling ctx (the client's notifications/cancelled) closes
// the exec stream, and the daemon kills the command's process group and
// audits it as cancelled by the client.
func (s *Server) runShell(ctx context.Context, req *mcp.CallToolRequest, tool, session string, c vmChoice, a shelltool.Args) *mcp.CallToolResult {
	out := newLiveOutput(a.MaxOutputSize)
	stop := s.progress(ctx, req, out)
	res, err := s.c.Exec(ctx, wire.ExecRequest{Argv: []string{a.Command}, Shell: true, Session: session, Image: c.image, Secrets: c.secrets, TimeoutMS: a.Timeout.Milliseconds(), Receipt: true},
		client.ExecIO{Stdout: out, Stderr: out})
	stop()
	var re *client.ReceiptError
	if res != nil && errors.As(err, &re) && err == error(re) {
		// The command ran; only its receipt was refused.
		s.receipts.keep(shelltool.Outcome{RequestID: res.RequestID, ReceiptErr: err})
		err = nil
	} else if res != nil {
		s.receipts.keep(shelltool.Outcome{RequestID: res.RequestID, Receipt: res.Receipt})
	}
	if err != nil {
		o := shelltool.Outcome{Err: err, Receipt: client.ReceiptOf(err), RequestID: client.RequestIDOf(err)}
		if errors.As(err, &re) {
			o.ReceiptErr = re
		}
		s.receipts.keep(o)
		if ctx.Err() != nil {
			s.log.Info("call cancelled: its command was killed", "tool", tool, "session", session, "err", err)
		} else {
			s.log.Warn("command not run", "tool", tool, "session", session, "err", err)
		}
		return withRequestID(textResult("vmgate: "+err.Error()+"\n[exit code: -1]", true), o)
	}
	s.log.Debug("command ran", "tool", tool, "session", session, "req", res.RequestID,
		"exit_code", res.ExitCode, "timed_out", res.TimedOut)
	kept := out.Bytes()
	r := textResult(shelltool.Format(kept, out.Truncated(), shelltool.ExitCode(res), res.TimedOut), false)
	r.StructuredContent = ExecOutput{ExitCode: res.ShellExitCode(), Signal: res.Signal,
		Output: string(bytes.ToValidUTF8(kept, []byte("\uFFFD"))), Truncated: out.Truncated(), TimedOut: res.TimedOut,
		DurationMS: res.ExecMS, TotalMS: res.TotalMS, VM: res.VMID, RequestID: res.RequestID, Session: session}
	return withRequestID(r, shelltool.Outcome{RequestID: res.RequestID})
}
