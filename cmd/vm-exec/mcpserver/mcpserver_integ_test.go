package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/names"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

// integPolicy: shell strings and sessions allowed, one deny rule to be
// refused by. The VM shape is the default one, whose template the daemon
// builds at start (shared across runs through VMGATE_TEST_TEMPLATES).
const integPolicy = `version = 1

[[profile]]
name = "mcp-test"
match = { any = true }
user = "agent"
max_vms = 4
allow_shell = true
output_limit = "1MiB"
[profile.timeout]
default = "30s"
max = "5m"
[profile.sessions]
allowed = true
idle_timeout = "5m"
max_lifetime = "30m"

[[profile.deny]]
name = "no-forbidden"
args_any = ["*forbidden-word*"]
`

// startDaemon runs the real gateway in-process on a socket in a temp dir,
// with templates and a pool of one, and waits until the pool is ready so
// that each fresh VM is a restore (< 1 s) rather than a boot.
func startDaemon(t *testing.T) *gatewaytest.Daemon {
	t.Helper()
	d := gatewaytest.Start(t, integPolicy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir, c.MaxVMs = false, 1, testutil.TemplateDir(t), 4
	})
	wctx, wcancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer wcancel()
	if err := d.WaitPool(wctx, 1); err != nil {
		t.Fatal(err)
	}
	return d
}

// sessionNames lists the caller's sessions on the gateway.
func sessionNames(t *testing.T, c *client.Client) []string {
	t.Helper()
	ss, err := c.Sessions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range ss {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	return names
}

func wantText(t *testing.T, what, text string, isErr, wantErr bool, re string) {
	t.Helper()
	if isErr != wantErr {
		t.Errorf("%s: IsError = %v, want %v; text %q", what, isErr, wantErr, text)
	}
	if !regexp.MustCompile(re).MatchString(text) {
		t.Errorf("%s: text %q does not match %s", what, text, re)
	}
}

// TestMCP_Gateway drives the server with the SDK's client against the real
// daemon booting real VMs: the tools, their result texts, refusals and
// sessions, including those a client leaves behind.
func TestMCP_Gateway(t *testing.T) {
	d := startDaemon(t)
	sock, c := d.Socket, d.Client
	tc := connect(t, c, nil)

	t.Run("tools/list", func(t *testing.T) { checkToolList(t, tc.cs) })

	t.Run("uname", func(t *testing.T) {
		text, isErr := tc.call(t, shelltool.Name, map[string]any{"command": "uname -a"})
		wantText(t, "uname -a", text, isErr, false, `^Linux vmgate .*\n\n\[exit code: 0\]$`)
	})
	t.Run("streams and exit code", func(t *testing.T) {
		text, isErr := tc.call(t, shelltool.Name, map[string]any{"command": "sh -c 'echo out; echo err >&2; exit 3'"})
		wantText(t, "exit 3", text, isErr, false, `\n\[exit code: 3\]$`)
		if !strings.Contains(text, "out\n") || !strings.Contains(text, "err\n") {
			t.Errorf("a stream is missing: %q", text)
		}
	})
	t.Run("truncation", func(t *testing.T) {
		text, isErr := tc.call(t, shelltool.Name, map[string]any{"command": "seq 1 1000", "max_output_size": 20})
		if want := "1\n2\n3\n4\n5\n6\n7\n8\n9\n10" + shelltool.TruncatedMarker + "\n[exit code: 0]"; text != want || isErr {
			t.Errorf("got %q (IsError %v), want %q", text, isErr, want)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		t0 := time.Now()
		// 5 s: the first output of a fresh VM under TCG, beside a pool
		// restore, may take seconds.
		text, isErr := tc.call(t, shelltool.Name, map[string]any{"command": "echo started; sleep 30; echo never", "timeout": "5"})
		wantText(t, "sleep 30", text, isErr, false, `^started\n\n\[exit code: 1\] \[exit due to timed out\]$`)
		if d := time.Since(t0); d > 25*time.Second {
			t.Errorf("took %v with a 5 s timeout", d)
		}
	})
	t.Run("denied", func(t *testing.T) {
		text, isErr := tc.call(t, shelltool.Name, map[string]any{"command": "echo forbidden-word"})
		wantText(t, "denied", text, isErr, true, `^vmgate: denied by policy profile mcp-test: rule deny\[0\] no-forbidden: .*\n\[exit code: -1\]$`)
	})
	t.Run("a secret the profile does not list", func(t *testing.T) {
		// The tool's secrets reach the daemon, whose policy decides.
		text, isErr := tc.call(t, shelltool.Name, map[string]any{"command": "true", "secrets": []string{"GH_TOKEN"}})
		wantText(t, "secret", text, isErr, true, `^vmgate: denied by policy profile mcp-test: rule secrets: secret "GH_TOKEN" is not one of the profile's secrets \(none\)\n\[exit code: -1\]$`)
	})
	t.Run("session files", func(t *testing.T) {
		text, isErr := tc.call(t, ToolSessionStart, map[string]any{"name": "files"})
		if isErr || text != "files" {
			t.Fatalf("session_start: %q", text)
		}
		awkward := "line 'one'\n\"two\" $(false) `x` \\n\n"
		text, isErr = tc.call(t, ToolSessionWriteFile, map[string]any{"session": "files", "path": "/tmp/work/sub/a.txt", "content": awkward})
		if isErr || !strings.HasPrefix(text, "wrote ") {
			t.Fatalf("write: %q", text)
		}
		if text, isErr = tc.call(t, ToolSessionReadFile, map[string]any{"session": "files", "path": "/tmp/work/sub/a.txt"}); isErr || text != awkward {
			t.Fatalf("read back: %q (IsError %v), want %q", text, isErr, awkward)
		}
		if text, isErr = tc.call(t, ToolSessionWriteFile, map[string]any{"session": "files", "path": "/tmp/work/b.bin", "content": "AAH/", "encoding": "base64"}); isErr {
			t.Fatalf("binary write: %q", text)
		}
		if text, isErr = tc.call(t, ToolSessionReadFile, map[string]any{"session": "files", "path": "/tmp/work/b.bin"}); isErr || text != "[base64]\nAAH/" {
			t.Fatalf("binary read: %q", text)
		}
		// The shell sees the same files.
		text, _ = tc.call(t, ToolSessionExec, map[string]any{"session": "files", "command": "wc -c < /tmp/work/sub/a.txt"})
		wantText(t, "wc", text, false, false, fmt.Sprintf(`^%d\n\n\[exit code: 0\]$`, len(awkward)))
		if text, isErr = tc.call(t, ToolSessionReadFile, map[string]any{"session": "files", "path": "/tmp/work/missing"}); !isErr || !strings.Contains(text, "No such file") {
			t.Fatalf("missing file: %q (IsError %v)", text, isErr)
		}
		if text, isErr = tc.call(t, ToolSessionEnd, map[string]any{"session": "files"}); isErr {
			t.Fatalf("session_end: %q", text)
		}
	})
	t.Run("session", func(t *testing.T) {
		name, isErr := tc.call(t, ToolSessionStart, nil)
		if isErr || !names.Session(name) || !strings.HasPrefix(name, sessionNamePrefix) {
			t.Fatalf("session_start: %q (IsError %v)", name, isErr)
		}
		if got := sessionNames(t, c); !slices.Equal(got, []string{name}) {
			t.Fatalf("gateway sessions %v, want [%s]", got, name)
		}
		text, isErr := tc.call(t, ToolSessionExec, map[string]any{"session": name, "command": "echo kept > /tmp/f; cd /tmp && pwd"})
		wantText(t, "write", text, isErr, false, `^/tmp\n\n\[exit code: 0\]$`)
		text, isErr = tc.call(t, ToolSessionExec, map[string]any{"session": name, "command": "cat /tmp/f", "timeout": 20})
		wantText(t, "read back", text, isErr, false, `^kept\n\n\[exit code: 0\]$`)
		// A one-shot command gets a fresh VM without the file.
		text, isErr = tc.call(t, shelltool.Name, map[string]any{"command": "cat /tmp/f"})
		wantText(t, "fresh VM", text, isErr, false, `No such file.*\n\n\[exit code: 1\]$`)
		// Policy refusals inside a session are tool errors too.
		text, isErr = tc.call(t, ToolSessionExec, map[string]any{"session": name, "command": "echo forbidden-word"})
		wantText(t, "denied in session", text, isErr, true, `denied by policy.*no-forbidden`)
		// A session without network may be locked to none, and no rule
		// can be added (gateway.TestGateway_NetLock locks a networked one).
		text, isErr = tc.call(t, ToolSessionNetLock, map[string]any{"session": name})
		wantText(t, "net lock", text, isErr, false, `has no network from now on`)
		text, isErr = tc.call(t, ToolSessionNetLock, map[string]any{"session": name, "allow": []string{"example.com:443"}})
		wantText(t, "net lock wider", text, isErr, true, `denied by policy profile mcp-test: rule network.allow: network rule "example.com:443": the profile has no network`)
		text, isErr = tc.call(t, ToolSessionExec, map[string]any{"session": name, "command": "cat /tmp/f"})
		wantText(t, "after the lock", text, isErr, false, `^kept\n\n\[exit code: 0\]$`)

		text, isErr = tc.call(t, ToolSessionEnd, map[string]any{"session": name})
		wantText(t, "session_end", text, isErr, false, `ended`)
		if got := sessionNames(t, c); len(got) != 0 {
			t.Fatalf("sessions after session_end: %v", got)
		}
		text, isErr = tc.call(t, ToolSessionExec, map[string]any{"session": name, "command": "true"})
		wantText(t, "after end", text, isErr, true, `no session "`+name+`"`)
	})
	t.Run("named session", func(t *testing.T) {
		name, isErr := tc.call(t, ToolSessionStart, map[string]any{"name": "work.1"})
		if isErr || name != "work.1" {
			t.Fatalf("session_start work.1: %q (IsError %v)", name, isErr)
		}
		text, isErr := tc.call(t, ToolSessionStart, map[string]any{"name": "work.1"})
		wantText(t, "again", text, isErr, true, `already running`)
		// Ended behind the server's back (like the gateway's idle timeout):
		// reported, not silently re-created empty.
		if err := c.EndSession(context.Background(), "work.1"); err != nil {
			t.Fatal(err)
		}
		text, isErr = tc.call(t, ToolSessionExec, map[string]any{"session": "work.1", "command": "true"})
		wantText(t, "ended outside", text, isErr, true, `has ended`)
		if got := sessionNames(t, c); len(got) != 0 {
			t.Fatalf("sessions: %v", got)
		}
		// A session someone else started under that name is not taken over.
		if _, err := c.Exec(context.Background(), wire.ExecRequest{Argv: []string{"true"}, Session: "theirs"}, client.ExecIO{}); err != nil {
			t.Fatal(err)
		}
		text, isErr = tc.call(t, ToolSessionStart, map[string]any{"name": "theirs"})
		wantText(t, "theirs", text, isErr, true, `already exists outside this server`)
		if err := c.EndSession(context.Background(), "theirs"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("pause and fork", func(t *testing.T) { testBranch(t, c) })
	t.Run("background processes", func(t *testing.T) {
		name, isErr := tc.call(t, ToolSessionStart, map[string]any{"name": "bg"})
		if isErr || name != "bg" {
			t.Fatalf("session_start: %q", name)
		}
		text, isErr := tc.call(t, ToolProcStart, map[string]any{"session": "bg", "stdin": true,
			"command": "echo ready; while read l; do echo got $l; done; echo done"})
		var h int64
		if _, err := fmt.Sscanf(text, "started background process %d", &h); isErr || err != nil {
			t.Fatalf("%s: %q (%v)", ToolProcStart, text, err)
		}
		if text, isErr = tc.call(t, ToolProcInput, map[string]any{"session": "bg", "handle": h, "input": "one\n", "eof": true}); isErr {
			t.Fatalf("%s: %q", ToolProcInput, text)
		}
		var all string
		for range 20 {
			text, isErr = tc.call(t, ToolProcOutput, map[string]any{"session": "bg", "handle": h, "wait": 5})
			if isErr {
				t.Fatalf("%s: %q", ToolProcOutput, text)
			}
			all = text
			if strings.Contains(text, "exited with code 0") {
				break
			}
		}
		if !strings.HasPrefix(all, "ready\ngot one\ndone\n") || !strings.Contains(all, "exited with code 0; next: ") {
			t.Errorf("%s: %q", ToolProcOutput, all)
		}
		text, _ = tc.call(t, ToolProcStart, map[string]any{"session": "bg", "command": "sleep 600"})
		if _, err := fmt.Sscanf(text, "started background process %d", &h); err != nil {
			t.Fatalf("%s: %q", ToolProcStart, text)
		}
		if text, isErr = tc.call(t, ToolProcKill, map[string]any{"session": "bg", "handle": h, "signal": "KILL"}); isErr {
			t.Fatalf("%s: %q", ToolProcKill, text)
		}
		if text, isErr = tc.call(t, ToolProcOutput, map[string]any{"session": "bg", "handle": h, "wait": 10}); isErr || !strings.Contains(text, "killed by signal KILL") {
			t.Errorf("after the kill: %q", text)
		}
		if text, isErr = tc.call(t, ToolProcOutput, map[string]any{"session": "bg", "handle": 999}); !isErr {
			t.Errorf("an unknown handle: %q", text)
		}
		if text, isErr = tc.call(t, ToolSessionEnd, map[string]any{"session": "bg"}); isErr {
			t.Fatalf("session_end: %q", text)
		}
	})
	t.Run("closing the client ends its sessions", func(t *testing.T) {
		tc2 := connect(t, c, nil)
		a, isErr := tc2.call(t, ToolSessionStart, map[string]any{"name": "left-a"})
		if isErr {
			t.Fatalf("session_start: %q", a)
		}
		b, isErr := tc2.call(t, ToolSessionStart, nil)
		if isErr {
			t.Fatalf("session_start: %q", b)
		}
		if got := sessionNames(t, c); len(got) != 2 {
			t.Fatalf("sessions: %v", got)
		}
		if err := tc2.close(t); err != nil {
			t.Fatal(err)
		}
		if got := sessionNames(t, c); len(got) != 0 {
			t.Fatalf("sessions left after the client closed: %v", got)
		}
	})
	t.Run("typed results", func(t *testing.T) { testTyped(t, tc) })
	t.Run("2024-11-05 client", func(t *testing.T) {
		old := connectOpts(t, c, nil, &mcp.ClientSessionOptions{ProtocolVersion: "2024-11-05"})
		if v := old.cs.InitializeResult().ProtocolVersion; v != "2024-11-05" {
			t.Fatalf("negotiated %s", v)
		}
		text, isErr := old.call(t, shelltool.Name, map[string]any{"command": "echo old client"})
		wantText(t, "2024-11-05", text, isErr, false, `^old client\n\n\[exit code: 0\]$`)
	})
	t.Run("live output and cancel", func(t *testing.T) { testCancel(t, d) })
	t.Run("vm-exec mcp", func(t *testing.T) { testBinary(t, sock, c) })
	t.Run("vm-exec mcp killed", func(t *testing.T) { testBinaryKilled(t, sock, c) })
}

// testBranch: session_pause and session_fork do real work on the real
// daemon. A paused session's VM is freed; a fork of the paused session
// makes copies that have its files, leave it paused and see none of each
// other's writes; the session's next command resumes it as it was; the
// copies end with the server that made them, as its sessions do.
func testBranch(t *testing.T, c *client.Client) {
	tc := connect(t, c, nil)
	if text, isErr := tc.call(t, ToolSessionStart, map[string]any{"name": "branch"}); isErr {
		t.Fatalf("session_start: %q", text)
	}
	text, isErr := tc.call(t, ToolSessionExec, map[string]any{"session": "branch", "command": "echo draft > /tmp/notes"})
	wantText(t, "write", text, isErr, false, `\[exit code: 0\]$`)
	text, isErr = tc.call(t, ToolSessionPause, map[string]any{"session": "branch"})
	wantText(t, "session_pause", text, isErr, false, `^session "branch" paused \([1-9][0-9]* MiB on disk\); its next command resumes it$`)
	state := func(name string) wire.Session {
		t.Helper()
		ss, err := c.Sessions(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no session %q: %+v", name, ss)
		return wire.Session{}
	}
	if s := state("branch"); s.State != wire.SessionPaused || s.VMID != "" {
		t.Fatalf("after session_pause: %+v", s)
	}
	text, isErr = tc.call(t, ToolSessionFork, map[string]any{"session": "branch", "names": []string{"try1", "try2"}})
	wantText(t, "session_fork", text, isErr, false, `^try1\ntry2$`)
	if s := state("branch"); s.State != wire.SessionPaused {
		t.Errorf("a fork of a paused session resumed it: %+v", s)
	}
	for _, n := range []string{"try1", "try2"} {
		if s := state(n); s.Parent != "branch" || s.State != wire.SessionRunning {
			t.Errorf("copy %s: %+v", n, s)
		}
	}
	text, isErr = tc.call(t, ToolSessionExec, map[string]any{"session": "try1", "command": "cat /tmp/notes; echo one > /tmp/notes"})
	wantText(t, "try1", text, isErr, false, `^draft\n\n\[exit code: 0\]$`)
	for _, n := range []string{"try2", "branch"} {
		text, isErr = tc.call(t, ToolSessionExec, map[string]any{"session": n, "command": "cat /tmp/notes"})
		wantText(t, n+" after try1's write", text, isErr, false, `^draft\n\n\[exit code: 0\]$`)
		if n == "try2" {
			// The caller's two VMs (max_vms_per_caller): one for the resume.
			text, isErr = tc.call(t, ToolSessionEnd, map[string]any{"session": n})
			wantText(t, "session_end", text, isErr, false, `ended`)
		}
	}
	if err := tc.close(t); err != nil {
		t.Fatal(err)
	}
	if got := sessionNames(t, c); len(got) != 0 {
		t.Fatalf("sessions and copies left after the client closed: %v", got)
	}
}

// testBinaryKilled: llama-server ends its MCP servers with SIGKILL, so
// `vm-exec mcp` cannot end its sessions itself; the daemon ends them when
// the process's hold on them goes, long before their idle timeout (5m).
func testBinaryKilled(t *testing.T, sock string, c *client.Client) {
	dir := os.Getenv("VMGATE_TEST_BIN")
	if dir == "" {
		t.Skip("VMGATE_TEST_BIN not set: run the suite with `make test`")
	}
	cmd := exec.Command(filepath.Join(dir, "vm-exec"), "mcp")
	cmd.Env = append(os.Environ(), "VMGATE_SOCKET="+sock)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "vmgate-test", Version: "0"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Minute}, nil)
	if err != nil {
		t.Fatalf("connect to vm-exec mcp: %v", err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolSessionStart, Arguments: map[string]any{"name": "killed-session"}})
	if err != nil || res.IsError {
		t.Fatalf("session_start: %v %+v", err, res)
	}
	if got := sessionNames(t, c); len(got) != 1 {
		t.Fatalf("sessions after session_start: %v", got)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cs.Close()
	deadline := time.Now().Add(30 * time.Second)
	for len(sessionNames(t, c)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("session still there 30 s after its vm-exec mcp was killed: %v", sessionNames(t, c))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// testBinary runs the built `vm-exec mcp` as an MCP client would: a child
// process speaking JSON-RPC on its stdin/stdout.
func testBinary(t *testing.T, sock string, c *client.Client) {
	dir := os.Getenv("VMGATE_TEST_BIN")
	if dir == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI: VMGATE_TEST_BIN not set (run `make test`)")
		}
		t.Skip("VMGATE_TEST_BIN not set: run the suite with `make test`")
	}
	cmd := exec.Command(filepath.Join(dir, "vm-exec"), "mcp")
	cmd.Env = append(os.Environ(), "VMGATE_SOCKET="+sock)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "vmgate-test", Version: "0"}, nil).
		Connect(ctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Minute}, nil)
	if err != nil {
		t.Fatalf("connect to vm-exec mcp: %v\nstderr: %s", err, stderr.String())
	}
	checkToolList(t, cs)
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: shelltool.Name, Arguments: map[string]any{"command": "echo hi from $(uname -s); exit 4"}})
	if err != nil {
		t.Fatal(err)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; text != "hi from Linux\n\n[exit code: 4]" || res.IsError {
		t.Errorf("exec: %q (IsError %v)", text, res.IsError)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolSessionStart, Arguments: map[string]any{"name": "bin-session"}})
	if err != nil || res.IsError {
		t.Fatalf("session_start: %v %+v", err, res)
	}
	// Close: stdin is closed; the process must end its session and exit 0
	// (an error from Close is the process's exit status).
	if err := cs.Close(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("vm-exec mcp exited %d\nstderr: %s", ee.ExitCode(), stderr.String())
		}
		t.Fatalf("close: %v\nstderr: %s", err, stderr.String())
	}
	if got := sessionNames(t, c); len(got) != 0 {
		t.Fatalf("sessions left by vm-exec mcp: %v\nstderr: %s", got, stderr.String())
	}
	if !strings.Contains(stderr.String(), "bin-session") {
		t.Errorf("stderr does not log the session: %s", stderr.String())
	}
}

// testTyped: a command's structured result, from the real daemon.
func testTyped(t *testing.T, tc *testConn) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := tc.cs.CallTool(ctx, &mcp.CallToolParams{Name: shelltool.Name,
		Arguments: map[string]any{"command": "echo typed; exit 5"}})
	if err != nil {
		t.Fatal(err)
	}
	var out ExecOutput
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.ExitCode != 5 || out.Output != "typed\n" || out.Truncated || out.TimedOut || out.VM == "" || out.RequestID == "" || out.TotalMS < out.DurationMS {
		t.Errorf("structured content %s", b)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; text != "typed\n\n[exit code: 5]" {
		t.Errorf("text %q", text)
	}
}

// testCancel: in a session, a command that ignores SIGTERM shows its
// output live (a progress notification), is cancelled by the client when
// it does, and is dead with its whole process group within a second:
// the daemon's audit record, written once the command was reaped, says
// it was cancelled by the client, and no process of it is left in the
// session.
func testCancel(t *testing.T, d *gatewaytest.Daemon) {
	plog := &progressLog{}
	tc := connectOpts(t, d.Client, &mcp.ClientOptions{ProgressNotificationHandler: plog.handler}, nil)
	if name, isErr := tc.call(t, ToolSessionStart, map[string]any{"name": "cancel"}); isErr {
		t.Fatalf("session_start: %s", name)
	}
	// The time measured is the daemon's and the guest's: with two cores
	// under TCG, a VM being restored for the pool beside it (the session
	// took the pooled one) would be measured too.
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer wcancel()
	if err := d.WaitPool(wctx, 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var cancelledAt time.Time
	var once sync.Once
	plog.on = func(p *mcp.ProgressNotificationParams) {
		if strings.Contains(p.Message, "started") {
			once.Do(func() { cancelledAt = time.Now(); cancel() })
		}
	}
	params := &mcp.CallToolParams{Name: ToolSessionExec, Arguments: map[string]any{"session": "cancel", "timeout": 60,
		"command": "trap '' TERM INT HUP; echo started; sleep 50; echo never"}}
	params.SetProgressToken("cancel-1")
	if _, err := tc.cs.CallTool(ctx, params); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v (progress %+v)", err, plog.get())
	}
	rec := waitAudit(t, d.AuditPath, func(r audit.Record) bool {
		return r.Kind == audit.KindExec && r.Session == "cancel" && strings.Contains(strings.Join(r.Argv, " "), "sleep 50")
	})
	if !strings.Contains(rec.Error, "cancelled by the client") {
		t.Errorf("audit record's error %q: want it to say the client cancelled", rec.Error)
	}
	t.Logf("cancelled after %v of progress; the command was reaped %v after the cancel", plog.get()[0].Progress, rec.Time.Sub(cancelledAt))
	if d := rec.Time.Sub(cancelledAt); d > time.Second {
		t.Errorf("the command was reaped %v after the cancel, want < 1s (record %+v)", d, rec)
	}
	text, isErr := tc.call(t, ToolSessionExec, map[string]any{"session": "cancel", "command": "ps -eo comm= | grep -c '^sleep$' || true"})
	wantText(t, "processes left", text, isErr, false, `^0\n\n\[exit code: 0\]$`)
	if text, isErr := tc.call(t, ToolSessionEnd, map[string]any{"session": "cancel"}); isErr {
		t.Errorf("session_end: %s", text)
	}
}

// waitAudit returns the first record of the daemon's audit log that
// match accepts, waiting for it to be written (at most 30 s).
func waitAudit(t *testing.T, path string, match func(audit.Record) bool) audit.Record {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(b, []byte("\n")) {
			var r audit.Record
			if json.Unmarshal(line, &r) == nil && match(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no such audit record in 30 s:\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
