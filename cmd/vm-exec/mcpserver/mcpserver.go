// Package mcpserver is `vm-exec mcp`: a Model Context Protocol server on
// stdio that gives an MCP client (llama-server's --mcp-servers-config,
// desktop assistants, agent harnesses) shell tools whose commands run in
// vmgate's disposable VMs, through the gateway, never on the host.
//
// Tools:
//
//   - exec_shell_command (command, timeout, max_output_size): llama-server's
//     built-in tool of that name, parameters and result text included
//     (package shelltool), in a fresh VM per call.
//   - session_start (optional name) → the session's name: a VM kept across
//     calls, created at once (by running `true` in it) so that a refusal
//     or a VM failure shows up here rather than on the first command.
//   - session_exec (session, command, timeout, max_output_size): as
//     exec_shell_command, in the session's VM.
//   - session_end (session).
//   - session_pause, session_fork (branch.go); session_net_lock (session,
//     allow): the session's network narrowed for the rest of its life
//     (netlock.go).
//   - receipt (optional request_id): the signed receipt of a command the
//     exec tools ran (receipts.go).
//
// A command that ran is a normal tool result whatever its exit code (the
// text ends with "[exit code: N]"). A command that never ran — refused by
// the policy, gateway unreachable or busy, VM failure, bad arguments — is a
// tool result with IsError set and a text that says why, so the model can
// read it and adapt; protocol errors are left to the SDK.
//
// Sessions: the server only runs commands in sessions it started, and ends
// them all when its client goes away (stdin closed) or its context is
// cancelled (SIGTERM), so that a client that forgets session_end, or
// crashes, leaves no VM behind. The gateway's idle timeout and maximum
// lifetime still apply; session_exec reports a session the gateway has
// ended instead of silently starting a fresh one under the same name.
//
// Revisions: the server speaks MCP 2026-07-28 and the revisions before it
// down to 2024-11-05 (llama.cpp's) side by side, on the same stdio. A
// client of the new revision calls server/discover and then sends
// requests that each carry their protocol version and capabilities in
// _meta, with no initialize and no protocol session; an older client
// starts with initialize. The new revision keeps no state between
// requests, so whatever lasts across calls needs a handle the client
// passes explicitly: a session's name is that handle (session_start
// returns it, every session tool takes it). tools/list and
// server/discover carry ttlMs (listTTL): the list is fixed for the
// server's life.
//
// Results: exec_shell_command and session_exec return llama-server's text
// as their content and the same facts as structured content
// (ExecOutput, the tools' outputSchema). While a command runs, a client
// that sent a progress token gets its output in progress notifications
// (run.go). A client's notifications/cancelled closes the command's exec
// stream: the daemon kills the command's process group at once and
// audits it as cancelled by the client. Every tool carries annotations
// (annotations.go).
//
// The wire (transport.go): no message is over MaxMessage (8 MiB, the
// longest line llama.cpp's client reads), and at stdin EOF every request
// already read is answered before the server stops.
//
// The protocol itself (JSON-RPC framing, version negotiation, schemas) is
// the official Go SDK's (github.com/modelcontextprotocol/go-sdk).
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/names"
	"github.com/vmgate/vmgate/internal/version"
)

// Name is the server's name in the MCP handshake.
const Name = "vmgate"

// Tool names besides shelltool.Name.
const (
	ToolSessionStart = "session_start"
	ToolSessionExec  = "session_exec"
	ToolSessionEnd   = "session_end"
)

// Instructions is the text the server gives clients for the model.
const Instructions = `The tools of this server run shell commands in disposable Linux (Debian) virtual machines, never on the user's computer. ` +
	`exec_shell_command runs each command in a fresh VM that is destroyed afterwards: files, installed packages, the working directory and background processes do not carry over to the next call. ` +
	`To keep files and installed packages across commands, call session_start, run commands with session_exec and the session name it returns, and call session_end when done; sessions also end when this server stops or after the operator's idle time. ` +
	`Once a session has what it needs from the network, session_net_lock takes its network away for good. ` +
	`Output is stdout and stderr combined, then "[exit code: N]". An operator policy decides what may run (it may refuse commands, and the VMs may have no network); a refusal is reported as a tool error that says why.`

// Options configures a Server.
type Options struct {
	// Client reaches vmgated (required).
	Client *client.Client
	// Log receives the server's own events (nil: slog.Default()).
	Log *slog.Logger
	// Version is announced in the handshake (empty: from the build).
	Version string
	// EndTimeout bounds ending the server's sessions at shutdown
	// (default 30s).
	EndTimeout time.Duration
}

// Server is an MCP server whose tools run commands through vmgated. Use
// New; Run serves one client.
type Server struct {
	mcp        *mcp.Server
	c          *client.Client
	log        *slog.Logger
	endTimeout time.Duration

	// runCtx is Run's context: tool calls are cancelled with it (the SDK
	// waits for them on shutdown without cancelling them). Set once by
	// Run before any call is served.
	runCtx context.Context

	mu sync.Mutex
	// sessions started here and not ended, each with the end of its hold
	// (client.HoldSession: the daemon ends it if this process dies).
	sessions map[string]context.CancelFunc
	closed   bool // shutting down: no new sessions
	ran      bool

	receipts receiptStore

	// toolsMu makes a change of several tools one change for the
	// clients: held to write by the change, to read by tools/list.
	toolsMu sync.RWMutex
	// toolsFinal: the tool list changes no more (probe is over);
	// probed is closed then.
	toolsFinal atomic.Bool
	probed     chan struct{}
}

// probeWait bounds how long a tools/list waits for the probe of the
// daemon (which decides the command tools' openWorldHint): a client that
// lists once at start, and never again, then gets the hints right, and
// one with a short limit (llama-server: 10 s) still its answer.
const probeWait = 2 * time.Second

// New returns a server with the tools registered.
func New(o Options) *Server {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Version == "" {
		o.Version = version.Get().Version
	}
	if o.EndTimeout <= 0 {
		o.EndTimeout = 30 * time.Second
	}
	s := &Server{c: o.Client, log: o.Log, endTimeout: o.EndTimeout, sessions: map[string]context.CancelFunc{}, runCtx: context.Background(),
		probed: make(chan struct{})}
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: Name, Title: "vmgate: commands in disposable VMs", Version: o.Version},
		&mcp.ServerOptions{Instructions: Instructions, Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
			SetCacheable: s.setCacheable})
	s.mcp.AddReceivingMiddleware(s.listToolsWhole)
	s.addExecTools(true)
	s.mcp.AddTool(&mcp.Tool{
		Name: ToolSessionStart,
		Description: "Start a session: a disposable Linux VM kept across session_exec calls (files and installed packages stay; " +
			"each command starts in the same initial directory) until session_end. Returns the session's name.",
		InputSchema: schemaFor[startArgs](func(p map[string]*jsonschema.Schema) {
			p["name"].Description = "Session name (" + names.SessionRule + "); generated when absent"
		}),
		Annotations: annotations[ToolSessionStart],
	}, s.wrap(s.sessionStart))
	s.mcp.AddTool(&mcp.Tool{
		Name:        ToolSessionEnd,
		Description: "End a session started with session_start: its VM is destroyed, with everything in it.",
		InputSchema: schemaFor[sessionArgs](nil),
		Annotations: annotations[ToolSessionEnd],
	}, s.wrap(s.sessionEnd))
	s.addFileTools()
	s.addBranchTools()
	s.addNetLockTool()
	s.addReceiptTool()
	s.addProcTools()
	return s
}

// addExecTools adds (or replaces) the two tools that run commands, with
// openWorld as their openWorldHint: whether the caller's VMs have a
// network (see annotations). The SDK replaces one tool at a time: a
// tools/list waits for both (toolsMu, listToolsWhole), so no client sees
// one changed and not the other, even one told of the first change by a
// list-changed notification sent before the second (the SDK's debounce
// is 10 ms).
func (s *Server) addExecTools(openWorld bool) {
	s.toolsMu.Lock()
	defer s.toolsMu.Unlock()
	s.mcp.AddTool(&mcp.Tool{
		Name:         ToolSessionExec,
		Description:  shelltool.Description + " The command runs as `sh -c` in the VM of a session started with session_start.",
		InputSchema:  sessionExecSchema(),
		OutputSchema: schemaFor[ExecOutput](nil),
		Annotations:  withOpenWorld(annotations[ToolSessionExec], openWorld),
	}, s.wrap(s.sessionExec))
	s.mcp.AddTool(&mcp.Tool{
		Name: shelltool.Name,
		Description: shelltool.Description + " The command runs as `sh -c` in a fresh disposable Linux VM, destroyed afterwards: " +
			"nothing carries over to the next call (use the session tools for that).",
		InputSchema:  execSchema(),
		OutputSchema: schemaFor[ExecOutput](nil),
		Annotations:  withOpenWorld(annotations[shelltool.Name], openWorld),
	}, s.wrap(s.execShellCommand))
	s.mcp.AddTool(s.procStartTool(openWorld), s.wrap(s.procStart))
}

// listToolsWhole is a middleware that answers tools/list once the probe
// of the daemon is over (at most probeWait) and while no change of
// several tools is under way (toolsMu).
func (s *Server) listToolsWhole(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == "tools/list" {
			select {
			case <-s.probed:
			case <-time.After(probeWait):
			case <-ctx.Done():
			}
			s.toolsMu.RLock()
			defer s.toolsMu.RUnlock()
		}
		return next(ctx, method, req)
	}
}

// probe asks the daemon, beside serving, what the caller's profile grants,
// and gives the command tools the openWorldHint it says: clients that
// listed the tools before are told the list changed.
func (s *Server) probe(ctx context.Context) {
	defer close(s.probed)
	defer s.toolsFinal.Store(true)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := s.c.Status(pctx)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			s.log.Warn("vmgated is not reachable now; tool calls will fail until it is", "err", err)
		}
	case st.Caller == nil:
		s.log.Warn("no profile of vmgated's policy takes this caller: tool calls will be refused")
	case !st.Caller.Network:
		s.addExecTools(false)
	}
}

// ServeStdio serves the client on stdin/stdout (see Run).
func (s *Server) ServeStdio(ctx context.Context) error {
	return s.Run(ctx, &mcp.StdioTransport{})
}

// Run serves one client on t until the client disconnects or ctx is done,
// then ends the sessions this server started. It may be called once.
//
// Postcondition: no session started by this server is left on the gateway,
// unless ending it failed (the error says which).
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	t = &drainTransport{t: t, log: s.log, stop: ctx}
	s.mu.Lock()
	if s.ran {
		s.mu.Unlock()
		return errors.New("mcp server: Run called twice")
	}
	s.ran = true
	s.runCtx = ctx
	s.mu.Unlock()
	// The daemon is probed beside serving, never before: a client that
	// lists tools once at start with a short limit (llama-server: 10 s)
	// must get its answers while the daemon is still starting (a list
	// waits for the probe probeWait at most).
	go s.probe(ctx)
	err := s.mcp.Run(ctx, t)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		err = nil // asked to stop (signal): not a failure
	}
	if err != nil {
		err = fmt.Errorf("mcp server: %w", err)
	}
	return errors.Join(err, s.endAll())
}

// wrap ties a tool call to Run's context and turns a handler's error into
// an error result.
func (s *Server) wrap(h func(context.Context, *mcp.CallToolRequest) *mcp.CallToolResult) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s.mu.Lock()
		runCtx := s.runCtx
		s.mu.Unlock()
		stop := context.AfterFunc(runCtx, cancel)
		defer stop()
		return h(ctx, req), nil
	}
}

// textResult is a tool result holding text; isErr marks a call whose
// command never ran.
func textResult(text string, isErr bool) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: isErr}
}

// gatewayError is the text of a call the gateway did not carry out, in
// shelltool's words.
func gatewayError(err error) *mcp.CallToolResult {
	return textResult("vmgate: "+err.Error(), true)
}

func (s *Server) execShellCommand(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	a, err := shelltool.ParseArgs(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	c, err := parseVMChoice(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	return s.runShell(ctx, req, shelltool.Name, "", c, a)
}

func (s *Server) sessionStart(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	name, err := parseStart(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	c, err := parseVMChoice(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	existing, err := s.c.Sessions(ctx)
	if err != nil {
		return gatewayError(err)
	}
	taken := func(n string) bool {
		return slices.ContainsFunc(existing, func(x wire.Session) bool { return x.Name == n })
	}
	if name == "" {
		name = newSessionName()
		for taken(name) {
			name = newSessionName()
		}
	}
	if s.has(name) {
		return textResult(fmt.Sprintf("session %q is already running: run commands in it with %s", name, ToolSessionExec), true)
	}
	if taken(name) {
		return textResult(fmt.Sprintf("session %q already exists outside this server: choose another name", name), true)
	}
	if err := s.add(name); err != nil {
		return textResult(err.Error(), true)
	}
	// `true` (no shell: the policy need not allow shell strings for this)
	// makes the gateway create the session's VM now.
	res, err := s.c.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}, Session: name, Image: c.image, Secrets: c.secrets}, client.ExecIO{})
	if err == nil && (res.ExitCode != 0 || res.TimedOut) {
		err = fmt.Errorf("`true` in the new VM: exit code %d, signal %q, timed out %v", res.ExitCode, res.Signal, res.TimedOut)
	}
	if err != nil {
		s.log.Warn("session not started", "session", name, "err", err)
		_ = s.end(name) // the VM may exist if the call failed after creating it
		return gatewayError(fmt.Errorf("session %q not started: %w", name, err))
	}
	s.hold(name)
	s.log.Info("session started", "session", name, "vm", res.VMID)
	return textResult(name, false)
}

func (s *Server) sessionExec(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	name, a, err := parseSessionExec(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, name); r != nil {
		return r
	}
	return s.runShell(ctx, req, ToolSessionExec, name, vmChoice{}, a)
}

func (s *Server) sessionEnd(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	name, err := parseEnd(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	if !s.has(name) {
		return textResult(fmt.Sprintf("no session %q started by this server", name), true)
	}
	if err := s.c.EndSession(ctx, name); err != nil && !notFound(err) {
		return gatewayError(err)
	}
	s.forget(name)
	s.log.Info("session ended", "session", name)
	return textResult(fmt.Sprintf("session %q ended", name), false)
}

func (s *Server) has(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.sessions[name]
	return ok
}

// hold ties session name to this process's life (see client.HoldSession):
// when the process dies, even by SIGKILL as llama-server ends its MCP
// servers, the daemon ends the session instead of keeping it until its
// idle timeout.
func (s *Server) hold(name string) {
	s.mu.Lock()
	ctx, cancel := context.WithCancel(s.runCtx)
	if _, ok := s.sessions[name]; !ok {
		s.mu.Unlock()
		cancel()
		return
	}
	s.sessions[name] = cancel
	s.mu.Unlock()
	if err := s.c.HoldSession(ctx, name); err != nil {
		s.log.Warn("session not tied to this process: it outlives it until the daemon's idle timeout", "session", name, "err", err)
	}
}

// add records a session about to be created.
func (s *Server) add(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return errors.New("the server is shutting down")
	}
	if _, ok := s.sessions[name]; ok {
		return fmt.Errorf("session %q is already running", name)
	}
	s.sessions[name] = nil
	return nil
}

func (s *Server) forget(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cancel := s.sessions[name]; cancel != nil {
		cancel()
	}
	delete(s.sessions, name)
}

// end ends session name on the gateway (whether or not it exists) and
// forgets it.
func (s *Server) end(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.endTimeout)
	defer cancel()
	err := s.c.EndSession(ctx, name)
	if notFound(err) {
		err = nil
	}
	s.forget(name)
	return err
}

// endAll ends every session this server started; no new one can start.
func (s *Server) endAll() error {
	s.mu.Lock()
	s.closed = true
	var names []string
	for n := range s.sessions {
		names = append(names, n)
	}
	s.mu.Unlock()
	slices.Sort(names)
	var errs []error
	for _, n := range names {
		if err := s.end(n); err != nil {
			s.log.Error("session left behind", "session", n, "err", err)
			errs = append(errs, err)
			continue
		}
		s.log.Info("session ended at shutdown", "session", n)
	}
	return errors.Join(errs...)
}

// notFound reports whether err is the gateway's "no such session".
func notFound(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && (ae.Status == http.StatusNotFound || ae.Body.Code == wire.CodeNotFound)
}
