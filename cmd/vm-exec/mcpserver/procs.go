package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/names"
)

// Tools of a session's background processes: a server, a build or a test
// run that goes on while the agent does other things, with a handle to
// read its output, send it input and stop it.
const (
	ToolProcStart  = "session_start_process"
	ToolProcOutput = "session_process_output"
	ToolProcInput  = "session_process_input"
	ToolProcKill   = "session_process_kill"
)

// maxProcOutput bounds the output one session_process_output returns.
const maxProcOutput = 64 << 10

// procStartTool is session_start_process with openWorld as its
// openWorldHint (addExecTools: it runs a command).
func (s *Server) procStartTool(openWorld bool) *mcp.Tool {
	return &mcp.Tool{
		Name: ToolProcStart,
		Description: "Start a shell command in the background of a session (a server, a long build): it runs on after this call " +
			"returns, until it ends, its time limit, or the session's end. Returns its handle, for " + ToolProcOutput + ", " +
			ToolProcInput + " and " + ToolProcKill + ".",
		InputSchema: schemaFor[procStartArgs](func(p map[string]*jsonschema.Schema) {
			p["timeout"].Minimum = float(1)
		}),
		Annotations: withOpenWorld(annotations[ToolProcStart], openWorld),
	}
}

// addProcTools registers the tools that read, feed and signal background
// processes (session_start_process is a command tool: addExecTools).
func (s *Server) addProcTools() {
	s.mcp.AddTool(&mcp.Tool{
		Name: ToolProcOutput,
		Description: "Read a background process's output (stdout and stderr, in the order written) from an offset: pass the " +
			"\"next\" of the previous call to read only what is new. Says whether it still runs, or how it ended.",
		InputSchema: schemaFor[procOutputArgs](func(p map[string]*jsonschema.Schema) {
			p["since"].Minimum = float(0)
			p["wait"].Minimum, p["wait"].Maximum = float(0), float(60)
		}),
		Annotations: annotations[ToolProcOutput],
	}, s.wrap(s.procOutput))
	s.mcp.AddTool(&mcp.Tool{
		Name:        ToolProcInput,
		Description: "Send text to a background process's standard input (started with stdin = true); eof = true closes it afterwards.",
		InputSchema: schemaFor[procInputArgs](nil),
		Annotations: annotations[ToolProcInput],
	}, s.wrap(s.procInput))
	s.mcp.AddTool(&mcp.Tool{
		Name:        ToolProcKill,
		Description: "Send a signal (TERM by default; KILL, INT, …) to a background process and every process it started.",
		InputSchema: schemaFor[procKillArgs](nil),
		Annotations: annotations[ToolProcKill],
	}, s.wrap(s.procKill))
}

// procStartArgs are session_start_process's arguments.
type procStartArgs struct {
	Session string `json:"session" jsonschema:"Session name"`
	Command string `json:"command" jsonschema:"Shell command, run as sh -c"`
	Timeout int64  `json:"timeout,omitempty" jsonschema:"Time limit in seconds (default: the longest the operator allows)"`
	Stdin   bool   `json:"stdin,omitempty" jsonschema:"Keep its standard input open for session_process_input"`
	User    string `json:"user,omitempty" jsonschema:"Guest user to run as (one the operator allows; default: the usual one)"`
}

// procOutputArgs are session_process_output's arguments.
type procOutputArgs struct {
	Session string `json:"session" jsonschema:"Session name"`
	Handle  int64  `json:"handle" jsonschema:"The process's handle"`
	Since   int64  `json:"since,omitempty" jsonschema:"Output offset to read from (the previous call's next; default 0)"`
	Wait    int64  `json:"wait,omitempty" jsonschema:"Seconds to wait for output or its end when there is none yet (default 0)"`
}

// procInputArgs are session_process_input's arguments.
type procInputArgs struct {
	Session string `json:"session" jsonschema:"Session name"`
	Handle  int64  `json:"handle" jsonschema:"The process's handle"`
	Input   string `json:"input,omitempty" jsonschema:"Text for its standard input"`
	EOF     bool   `json:"eof,omitempty" jsonschema:"Close its standard input afterwards"`
}

// procKillArgs are session_process_kill's arguments.
type procKillArgs struct {
	Session string `json:"session" jsonschema:"Session name"`
	Handle  int64  `json:"handle" jsonschema:"The process's handle"`
	Signal  string `json:"signal,omitempty" jsonschema:"Signal name (default TERM)"`
}

// decodeProcArgs decodes a tool's arguments strictly into v, whose session
// and handle (when it has them) must be a session name and a handle.
func decodeProcArgs(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", shelltool.ErrArgs, err)
	}
	var session string
	var handle int64 = 1
	switch a := v.(type) {
	case *procStartArgs:
		session, handle = a.Session, 1
		if strings.TrimSpace(a.Command) == "" {
			return fmt.Errorf("%w: \"command\" is empty", shelltool.ErrArgs)
		}
		if a.User != "" && !names.Account(a.User) {
			return fmt.Errorf("%w: \"user\" must be %s", shelltool.ErrArgs, names.AccountRule)
		}
	case *procOutputArgs:
		session, handle = a.Session, a.Handle
		if a.Since < 0 || a.Wait < 0 || a.Wait > 60 {
			return fmt.Errorf("%w: \"since\" is not negative, \"wait\" 0 to 60", shelltool.ErrArgs)
		}
	case *procInputArgs:
		session, handle = a.Session, a.Handle
		if len(a.Input) > wire.MaxProcInput {
			return fmt.Errorf("%w: at most %d bytes of input at once", shelltool.ErrArgs, wire.MaxProcInput)
		}
	case *procKillArgs:
		session, handle = a.Session, a.Handle
	}
	switch {
	case !names.Session(session):
		return fmt.Errorf("%w: \"session\" is not a session name", shelltool.ErrArgs)
	case handle <= 0:
		return fmt.Errorf("%w: \"handle\" is a positive integer", shelltool.ErrArgs)
	}
	return nil
}

func (s *Server) procStart(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	var a procStartArgs
	if err := decodeProcArgs(req.Params.Arguments, &a); err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, a.Session); r != nil {
		return r
	}
	p, err := s.c.StartProc(ctx, a.Session, wire.ExecRequest{Argv: []string{a.Command}, Shell: true, TimeoutMS: a.Timeout * 1000, Stdin: a.Stdin, User: a.User})
	if err != nil {
		return gatewayError(err)
	}
	return textResult(fmt.Sprintf("started background process %d (pid %d in the VM); read its output with %s", p.Handle, p.PID, ToolProcOutput), false)
}

func (s *Server) procOutput(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	var a procOutputArgs
	if err := decodeProcArgs(req.Params.Arguments, &a); err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, a.Session); r != nil {
		return r
	}
	var out bytes.Buffer
	next, dropped := a.Since, int64(0)
	var last wire.Proc
	err := s.c.ProcLogs(ctx, a.Session, a.Handle, a.Since, maxProcOutput, false, func(p wire.ProcOutput) error {
		for _, c := range p.Chunks {
			out.Write(c.Data)
		}
		next, last = p.Next, p.Proc
		dropped += p.Dropped
		return nil
	})
	if err == nil && out.Len() == 0 && a.Wait > 0 && last.State == wire.ProcRunning {
		// Nothing new yet: wait for output or the end, at most a.Wait.
		wctx, cancel := context.WithTimeout(ctx, secondsDur(a.Wait))
		err = s.c.ProcLogs(wctx, a.Session, a.Handle, next, maxProcOutput, true, func(p wire.ProcOutput) error {
			for _, c := range p.Chunks {
				out.Write(c.Data)
			}
			next, last = p.Next, p.Proc
			if out.Len() > 0 || p.Proc.State == wire.ProcExited {
				cancel()
			}
			return nil
		})
		cancel()
		if wctx.Err() != nil && ctx.Err() == nil {
			err = nil
		}
	}
	if err != nil {
		return gatewayError(err)
	}
	var b strings.Builder
	if dropped > 0 {
		fmt.Fprintf(&b, "[%d earlier bytes are no longer kept]\n", dropped)
	}
	text := out.String()
	if !utf8.ValidString(text) {
		text = strings.ToValidUTF8(text, "\uFFFD")
	}
	b.WriteString(text)
	if text != "" && !strings.HasSuffix(text, "\n") {
		b.WriteString("\n")
	}
	state := "still running"
	if code, ok := last.ExitStatus(); ok {
		state = "exited with code " + strconv.Itoa(code)
		if last.Signal != "" {
			state = "killed by signal " + last.Signal
		}
	}
	fmt.Fprintf(&b, "[process %d %s; next: %d]", a.Handle, state, next)
	return textResult(b.String(), false)
}

func (s *Server) procInput(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	var a procInputArgs
	if err := decodeProcArgs(req.Params.Arguments, &a); err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, a.Session); r != nil {
		return r
	}
	if err := s.c.ProcInput(ctx, a.Session, a.Handle, []byte(a.Input), a.EOF); err != nil {
		return gatewayError(err)
	}
	return textResult(fmt.Sprintf("sent %d bytes to process %d", len(a.Input), a.Handle), false)
}

func (s *Server) procKill(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	var a procKillArgs
	if err := decodeProcArgs(req.Params.Arguments, &a); err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, a.Session); r != nil {
		return r
	}
	sig := a.Signal
	if sig == "" {
		sig = "TERM"
	}
	if err := s.c.ProcSignal(ctx, a.Session, a.Handle, sig); err != nil {
		return gatewayError(err)
	}
	return textResult(fmt.Sprintf("sent %s to process %d", sig, a.Handle), false)
}

// secondsDur is n seconds.
func secondsDur(n int64) time.Duration { return time.Duration(n) * time.Second }
