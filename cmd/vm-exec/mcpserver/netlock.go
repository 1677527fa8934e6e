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
	"github.com/vmgate/vmgate/internal/names"
)

// ToolSessionNetLock locks a session's network for the rest of its life.
const ToolSessionNetLock = "session_net_lock"

// maxLockRules bounds session_net_lock's rules (the policy's limit).
const maxLockRules = 64

// addNetLockTool registers session_net_lock.
func (s *Server) addNetLockTool() {
	s.mcp.AddTool(&mcp.Tool{
		Name: ToolSessionNetLock,
		Description: "Lock a session's network for the rest of its life, e.g. once its dependencies are installed: only the egress rules in " +
			"\"allow\" (HOST:PORT, *.DOMAIN:PORT, CIDR:PORT; PORT may be *), none meaning no network at all. The rules must be within what " +
			"the operator's policy grants and within any earlier lock: a lock can only narrow, never widen. It holds across pauses and forks.",
		InputSchema: schemaFor[netLockArgs](func(p map[string]*jsonschema.Schema) {
			p["allow"].MaxItems = ptr(maxLockRules)
		}),
		Annotations: annotations[ToolSessionNetLock],
	}, s.wrap(s.sessionNetLock))
}

// netLockArgs are session_net_lock's arguments, and its schema's source.
type netLockArgs struct {
	Session string   `json:"session" jsonschema:"Session name"`
	Allow   []string `json:"allow,omitempty" jsonschema:"Egress rules still allowed; empty or absent: no network"`
}

// parseNetLock decodes session_net_lock's arguments (pure); the gateway
// judges the rules.
func parseNetLock(raw json.RawMessage) (netLockArgs, error) {
	var a netLockArgs
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		return a, fmt.Errorf("%w: %v", shelltool.ErrArgs, err)
	}
	switch {
	case !names.Session(a.Session):
		return a, fmt.Errorf("%w: \"session\" is not a session name", shelltool.ErrArgs)
	case len(a.Allow) > maxLockRules:
		return a, fmt.Errorf("%w: at most %d rules", shelltool.ErrArgs, maxLockRules)
	}
	return a, nil
}

func (s *Server) sessionNetLock(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	a, err := parseNetLock(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, a.Session); r != nil {
		return r
	}
	if _, err := s.c.LockSessionNet(ctx, a.Session, a.Allow); err != nil {
		return gatewayError(err)
	}
	if len(a.Allow) == 0 {
		return textResult(fmt.Sprintf("session %q has no network from now on", a.Session), false)
	}
	return textResult(fmt.Sprintf("session %q may reach only %s from now on", a.Session, strings.Join(a.Allow, " ")), false)
}
