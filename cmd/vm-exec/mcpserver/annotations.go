package mcpserver

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
)

// Tool annotations: hints for the client (whether to ask the user before
// a call, whether a call may be repeated), never a security boundary:
// the gateway's policy is.
//
//   - exec_shell_command changes nothing that outlives the call: its VM is
//     destroyed afterwards (destructiveHint false, not idempotent: it runs
//     whatever it is given).
//   - session_exec may delete or overwrite the session's files, which
//     later calls rely on (destructiveHint true).
//   - session_write_file overwrites a file (destructive), and writing the
//     same content twice leaves the same file (idempotent);
//     session_read_file only reads (readOnlyHint); session_end destroys
//     the session's VM (destructive; ending it twice ends it once);
//     session_pause keeps everything (not destructive; pausing twice
//     pauses once), session_fork only adds sessions; session_net_lock
//     takes network away from a session for good but destroys nothing
//     (locking twice to the same rules locks once); receipt only reads
//     what this server kept.
//   - openWorldHint says whether a tool reaches the world outside the
//     VM: the commands do when the caller's profile grants its VMs a
//     network. The server learns that from the daemon's status (its
//     "caller" grant), asked beside serving: until it knows, and when the
//     daemon cannot be reached, the command tools say true, the safe side
//     of the hint; once the daemon says the profile has no network they
//     say false, and clients are told the tool list changed. (A command
//     may still ask for less network than its profile: the hint is the
//     most it can reach.) The session management and file tools touch
//     only the VM (false).
var annotations = map[string]*mcp.ToolAnnotations{
	shelltool.Name: {Title: "Run a shell command in a fresh disposable VM",
		DestructiveHint: ptr(false), OpenWorldHint: ptr(true)},
	ToolSessionExec: {Title: "Run a shell command in a session's VM",
		DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	ToolSessionStart: {Title: "Start a session (a VM kept across calls)",
		DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	ToolSessionEnd: {Title: "End a session and destroy its VM",
		DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	ToolSessionWriteFile: {Title: "Write a file in a session's VM",
		DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
	ToolSessionReadFile: {Title: "Read a file in a session's VM",
		ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	ToolSessionPause: {Title: "Pause a session to disk (its next command resumes it)",
		DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(false)},
	ToolSessionFork: {Title: "Fork a session into copies of its state",
		DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	ToolSessionNetLock: {Title: "Lock a session's network (narrower, for good)",
		DestructiveHint: ptr(false), IdempotentHint: true, OpenWorldHint: ptr(false)},
	ToolReceipt: {Title: "Get the signed receipt of a command that ran",
		ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	ToolProcStart: {Title: "Start a command in the background of a session",
		DestructiveHint: ptr(true), OpenWorldHint: ptr(true)},
	ToolProcOutput: {Title: "Read a background process's output",
		ReadOnlyHint: true, OpenWorldHint: ptr(false)},
	ToolProcInput: {Title: "Send input to a background process",
		DestructiveHint: ptr(false), OpenWorldHint: ptr(false)},
	ToolProcKill: {Title: "Signal a background process",
		DestructiveHint: ptr(true), IdempotentHint: true, OpenWorldHint: ptr(false)},
}

func ptr[T any](v T) *T { return &v }

// withOpenWorld is a copy of a with openWorldHint set to open.
func withOpenWorld(a *mcp.ToolAnnotations, open bool) *mcp.ToolAnnotations {
	c := *a
	c.OpenWorldHint = ptr(open)
	return &c
}

// listTTL is the ttlMs of tools/list and server/discover (MCP
// 2026-07-28): how long a client may cache them. Both are fixed for the
// server's life once the daemon has said what the caller's profile
// grants (the command tools' openWorldHint), so an hour spares a client
// that lists often; a client that starts a new `vm-exec mcp` asks again
// anyway.
const listTTL = 3600_000

// setCacheable sets the cache hints of the results that carry them. The
// tool list is not cacheable until it is final (toolsFinal): a client
// that cached it before would keep the hints it had, and the SDK's own
// client cache keeps the answer to a list sent before a list-changed
// notification that arrived before that answer.
func (s *Server) setCacheable(_ context.Context, req mcp.Request, c *mcp.Cacheable) {
	switch req.(type) {
	case *mcp.ListToolsRequest:
		if s.toolsFinal.Load() {
			c.TTLMs, c.CacheScope = listTTL, "public"
		}
	case *mcp.ServerRequest[*mcp.DiscoverParams]:
		c.TTLMs, c.CacheScope = listTTL, "public"
	}
}
