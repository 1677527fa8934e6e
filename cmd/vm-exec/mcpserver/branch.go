package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/names"
)

// Tools that keep and branch a session's work.
const (
	ToolSessionPause = "session_pause"
	ToolSessionFork  = "session_fork"
)

// addBranchTools registers session_pause and session_fork.
func (s *Server) addBranchTools() {
	s.mcp.AddTool(&mcp.Tool{
		Name: ToolSessionPause,
		Description: "Pause a session to disk while you think: its VM is freed, and its next session_exec (or file tool) resumes it with " +
			"everything it had (files, installed packages, running background processes), with a fresh clock.",
		InputSchema: schemaFor[sessionArgs](nil),
		Annotations: annotations[ToolSessionPause],
	}, s.wrap(s.sessionPause))
	s.mcp.AddTool(&mcp.Tool{
		Name: ToolSessionFork,
		Description: "Fork a session into new sessions, each a copy of its state now (files, processes), to try several fixes from the " +
			"same point. The session keeps running; the copies never see each other's changes. Returns the new sessions' names, one per line.",
		InputSchema: schemaFor[forkArgs](func(p map[string]*jsonschema.Schema) {
			p["names"].Description = "Names of the new sessions (" + names.SessionRule + "); generated when absent"
			p["names"].MaxItems = ptr(wire.MaxForks)
			p["count"].Minimum, p["count"].Maximum = float(1), float(wire.MaxForks)
		}),
		Annotations: annotations[ToolSessionFork],
	}, s.wrap(s.sessionFork))
}

func (s *Server) sessionPause(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	name, err := requiredSession(req.Params.Arguments, "session")
	if err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, name); r != nil {
		return r
	}
	ss, err := s.c.PauseSession(ctx, name)
	if err != nil {
		return gatewayError(err)
	}
	return textResult(fmt.Sprintf("session %q paused (%d MiB on disk); its next command resumes it", name, ss.DiskBytes>>20), false)
}

// forkArgs are session_fork's arguments, and its schema's source.
type forkArgs struct {
	Session string   `json:"session" jsonschema:"Session name"`
	Names   []string `json:"names,omitempty"` // at most wire.MaxForks, each names.Session
	Count   int      `json:"count,omitempty" jsonschema:"How many copies, when names are absent (default 1)"`
}

// parseFork decodes session_fork's arguments (pure).
func parseFork(raw json.RawMessage) (forkArgs, error) {
	var a forkArgs
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return a, fmt.Errorf("%w: %v", shelltool.ErrArgs, err)
	}
	switch {
	case !names.Session(a.Session):
		return a, fmt.Errorf("%w: \"session\" is not a session name", shelltool.ErrArgs)
	case len(a.Names) > 0 && a.Count != 0:
		return a, fmt.Errorf("%w: give \"names\" or \"count\", not both", shelltool.ErrArgs)
	case len(a.Names) > wire.MaxForks || a.Count < 0 || a.Count > wire.MaxForks:
		return a, fmt.Errorf("%w: at most %d copies", shelltool.ErrArgs, wire.MaxForks)
	}
	for _, n := range a.Names {
		if !names.Session(n) {
			return a, fmt.Errorf("%w: %q is not a session name", shelltool.ErrArgs, n)
		}
	}
	return a, nil
}

func (s *Server) sessionFork(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	a, err := parseFork(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, a.Session); r != nil {
		return r
	}
	newNames := a.Names
	if len(newNames) == 0 {
		for range max(a.Count, 1) {
			newNames = append(newNames, newSessionName())
		}
	}
	for i, n := range newNames {
		if err := s.add(n); err != nil {
			for _, m := range newNames[:i] {
				s.forget(m)
			}
			return textResult(err.Error(), true)
		}
	}
	copies, err := s.c.ForkSession(ctx, a.Session, newNames)
	if err != nil {
		for _, n := range newNames {
			s.forget(n)
		}
		return gatewayError(err)
	}
	out := make([]string, 0, len(copies))
	for _, c := range copies {
		s.hold(c.Name) // the copies end with this server, as its sessions do
		out = append(out, c.Name)
	}
	return textResult(strings.Join(out, "\n"), false)
}
