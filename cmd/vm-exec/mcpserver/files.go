package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
)

// File tools for sessions: a model writes and reads a file by path and
// content, with no shell quoting (heredocs are where models go wrong).
const (
	ToolSessionWriteFile = "session_write_file"
	ToolSessionReadFile  = "session_read_file"
)

// Bounds of the file tools: content written at once, and read at once
// (max_bytes, default defaultRead).
const (
	maxWrite    = 1 << 20
	maxRead     = 1 << 20
	defaultRead = 256 << 10
	maxPath     = 4096
)

// writeArgs are session_write_file's arguments, and its schema's source.
type writeArgs struct {
	Session  string `json:"session" jsonschema:"Session name, from session_start"`
	Path     string `json:"path" jsonschema:"Absolute path in the session's VM"`
	Content  string `json:"content" jsonschema:"The file's content"`
	Encoding string `json:"encoding,omitempty" jsonschema:"How content is written (default text)"`
}

// writeArgs.Encoding's values; "" is encodingText.
const (
	encodingText   = "text"
	encodingBase64 = "base64"
)

// readArgs are session_read_file's arguments, and its schema's source.
type readArgs struct {
	Session  string `json:"session" jsonschema:"Session name, from session_start"`
	Path     string `json:"path" jsonschema:"Absolute path in the session's VM"`
	MaxBytes *int   `json:"max_bytes,omitempty"` // 1 to maxRead, default defaultRead
}

// guestPath checks a path the model names in the guest: absolute, clean
// enough to pass as one argument, no NUL.
func guestPath(p string) (string, error) {
	switch {
	case p == "":
		return "", fmt.Errorf("%w: \"path\" is missing", shelltool.ErrArgs)
	case !strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("%w: \"path\" %q must be absolute (the session's files live in the guest, e.g. /tmp/work/x.py)", shelltool.ErrArgs, p)
	case len(p) > maxPath || strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%w: \"path\" is longer than %d bytes or holds a NUL", shelltool.ErrArgs, maxPath)
	case strings.HasSuffix(p, "/"):
		return "", fmt.Errorf("%w: \"path\" %q names a directory", shelltool.ErrArgs, p)
	}
	return path.Clean(p), nil
}

func decodeArgs(raw json.RawMessage, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", shelltool.ErrArgs, err)
	}
	return nil
}

// parseWrite decodes session_write_file's arguments into the session,
// the path and the bytes to write.
func parseWrite(raw json.RawMessage) (string, string, []byte, error) {
	session, err := requiredSession(raw, "session")
	if err != nil {
		return "", "", nil, err
	}
	var a writeArgs
	if err := decodeArgs(raw, &a); err != nil {
		return "", "", nil, err
	}
	p, err := guestPath(a.Path)
	if err != nil {
		return "", "", nil, err
	}
	data := []byte(a.Content)
	switch a.Encoding {
	case "", encodingText:
	case encodingBase64:
		if data, err = base64.StdEncoding.DecodeString(a.Content); err != nil {
			return "", "", nil, fmt.Errorf("%w: \"content\" is not base64: %v", shelltool.ErrArgs, err)
		}
	default:
		return "", "", nil, fmt.Errorf("%w: \"encoding\" %q: want \"text\" or \"base64\"", shelltool.ErrArgs, a.Encoding)
	}
	if len(data) > maxWrite {
		return "", "", nil, fmt.Errorf("%w: content of %d bytes is over the %d-byte limit of one call", shelltool.ErrArgs, len(data), maxWrite)
	}
	return session, p, data, nil
}

// parseRead decodes session_read_file's arguments.
func parseRead(raw json.RawMessage) (string, string, int, error) {
	session, err := requiredSession(raw, "session")
	if err != nil {
		return "", "", 0, err
	}
	var a readArgs
	if err := decodeArgs(raw, &a); err != nil {
		return "", "", 0, err
	}
	p, err := guestPath(a.Path)
	if err != nil {
		return "", "", 0, err
	}
	n := defaultRead
	if a.MaxBytes != nil {
		if *a.MaxBytes < 1 || *a.MaxBytes > maxRead {
			return "", "", 0, fmt.Errorf("%w: \"max_bytes\" must be between 1 and %d", shelltool.ErrArgs, maxRead)
		}
		n = *a.MaxBytes
	}
	return session, p, n, nil
}

// readResult is what the model gets for a file's bytes: the text itself
// when it is UTF-8, base64 otherwise, and a note when it was cut.
func readResult(b []byte, limit int) string {
	truncated := len(b) > limit
	if truncated {
		b = b[:limit]
	}
	var out string
	if utf8.Valid(b) {
		out = string(b)
	} else {
		out = "[base64]\n" + base64.StdEncoding.EncodeToString(b)
	}
	if truncated {
		out += fmt.Sprintf("\n[truncated: the first %d bytes]", limit)
	}
	return out
}

// runArgv runs argv in session with stdin, and returns its stdout, or an
// error text for the model when it did not exit 0.
func (s *Server) runArgv(ctx context.Context, session string, argv []string, stdin []byte, outLimit int) ([]byte, *mcp.CallToolResult) {
	out := &shelltool.Capped{Limit: outLimit}
	errOut := &shelltool.Capped{Limit: 4096}
	sio := client.ExecIO{Stdout: out, Stderr: errOut}
	if stdin != nil {
		sio.Stdin = bytes.NewReader(stdin)
	}
	res, err := s.c.Exec(ctx, wire.ExecRequest{Argv: argv, Session: session}, sio)
	if err != nil {
		return nil, gatewayError(err)
	}
	if code := shelltool.ExitCode(res); code != 0 || res.TimedOut {
		return nil, textResult(fmt.Sprintf("%s failed (exit code %d): %s", argv[0], code, strings.TrimSpace(string(errOut.Bytes()))), true)
	}
	return out.Bytes(), nil
}

// checkSession is the session tools' common start: the session must be
// one this server started and still live. A session the gateway ended
// (idle timeout, lifetime) would be re-created empty by the next command
// under its name: say so instead.
func (s *Server) checkSession(ctx context.Context, name string) *mcp.CallToolResult {
	if !s.has(name) {
		return textResult(fmt.Sprintf("no session %q: start one with %s and use the name it returns", name, ToolSessionStart), true)
	}
	existing, err := s.c.Sessions(ctx)
	if err != nil {
		return gatewayError(err)
	}
	if !slices.ContainsFunc(existing, func(x wire.Session) bool { return x.Name == name }) {
		s.forget(name)
		return textResult(fmt.Sprintf("session %q has ended (the operator's idle timeout or maximum lifetime, or ended from outside): "+
			"its VM and files are gone; start a new one with %s", name, ToolSessionStart), true)
	}
	return nil
}

func (s *Server) sessionWriteFile(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	session, p, data, err := parseWrite(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, session); r != nil {
		return r
	}
	if dir := path.Dir(p); dir != "/" {
		if _, r := s.runArgv(ctx, session, []string{"mkdir", "-p", "--", dir}, nil, 4096); r != nil {
			return r
		}
	}
	// dd writes stdin to the file as it is: no shell, no quoting.
	if _, r := s.runArgv(ctx, session, []string{"dd", "of=" + p, "status=none"}, data, 4096); r != nil {
		return r
	}
	return textResult(fmt.Sprintf("wrote %d bytes to %s", len(data), p), false)
}

func (s *Server) sessionReadFile(ctx context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	session, p, limit, err := parseRead(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	if r := s.checkSession(ctx, session); r != nil {
		return r
	}
	b, r := s.runArgv(ctx, session, []string{"head", "-c", strconv.Itoa(limit + 1), "--", p}, nil, limit+1)
	if r != nil {
		return r
	}
	return textResult(readResult(b, limit), false)
}

func (s *Server) addFileTools() {
	s.mcp.AddTool(&mcp.Tool{
		Name: ToolSessionWriteFile,
		Description: fmt.Sprintf("Write a file in a session's VM (created with its parent directories, or replaced), from content given as is: "+
			"no shell quoting. At most %d bytes per call; binary content as base64 with encoding \"base64\".", maxWrite),
		InputSchema: schemaFor[writeArgs](func(p map[string]*jsonschema.Schema) {
			p["encoding"].Enum = []any{encodingText, encodingBase64}
		}),
		Annotations: annotations[ToolSessionWriteFile],
	}, s.wrap(s.sessionWriteFile))
	s.mcp.AddTool(&mcp.Tool{
		Name: ToolSessionReadFile,
		Description: fmt.Sprintf("Read a file in a session's VM: its text, or base64 (marked [base64]) when it is not UTF-8; "+
			"at most max_bytes (default %d, at most %d), with a note when cut.", defaultRead, maxRead),
		InputSchema: schemaFor[readArgs](func(p map[string]*jsonschema.Schema) {
			p["max_bytes"].Minimum, p["max_bytes"].Maximum = float(1), float(maxRead)
		}),
		Annotations: annotations[ToolSessionReadFile],
	}, s.wrap(s.sessionReadFile))
}
