package mcpserver

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/names"
)

// handSchemas are the schemas as they were written by hand before they
// were derived from the types (exec_shell_command's still is, and
// session_exec builds on it): what clients were told, and must still be.
func handSchemas() (in map[string]map[string]any, out map[string]any) {
	obj := func(props map[string]any, required ...string) map[string]any {
		m := map[string]any{"type": "object", "properties": props}
		if len(required) > 0 {
			m["required"] = required
		}
		return m
	}
	str := func(d string) map[string]any { return map[string]any{"type": "string", "description": d} }
	integer := func(d string) map[string]any { return map[string]any{"type": "integer", "description": d} }
	boolean := func(d string) map[string]any { return map[string]any{"type": "boolean", "description": d} }
	list := func(d string, most int) map[string]any {
		return map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "maxItems": most, "description": d}
	}
	sessionExec := shelltool.Schema()
	sessionExec["properties"].(map[string]any)["session"] = str("Session name returned by session_start")
	sessionExec["required"] = []string{"session", "command"}
	// The images and secrets came after the schemas were written by
	// hand: their properties were derived from the start.
	secrets := func(whose string) map[string]any {
		return map[string]any{"type": "array", "items": map[string]any{"type": "string"},
			"description": "Names of the operator's secrets the " + whose + ": each variable holds a placeholder that the VM's network replaces with the real value, only in requests to that secret's hosts"}
	}
	exec := shelltool.Schema()
	exec["properties"].(map[string]any)["image"] = str("Image the VM runs, one the operator allows (default: the usual one)")
	exec["properties"].(map[string]any)["secrets"] = secrets("command gets")
	in = map[string]map[string]any{
		shelltool.Name:  exec,
		ToolSessionExec: sessionExec,
		ToolSessionStart: obj(map[string]any{"name": str("Session name (" + names.SessionRule + "); generated when absent"),
			"image":   str("Image the session's VM runs, one the operator allows (default: the usual one); the session keeps it"),
			"secrets": secrets("session's commands get")}),
		ToolSessionEnd: obj(map[string]any{"session": str("Session name")}, "session"),
		ToolSessionWriteFile: obj(map[string]any{
			"session": str("Session name, from session_start"), "path": str("Absolute path in the session's VM"),
			"content":  str("The file's content"),
			"encoding": map[string]any{"type": "string", "enum": []string{"text", "base64"}, "description": "How content is written (default text)"},
		}, "session", "path", "content"),
		ToolSessionReadFile: obj(map[string]any{
			"session": str("Session name, from session_start"), "path": str("Absolute path in the session's VM"),
			"max_bytes": map[string]any{"type": "integer", "minimum": 1, "maximum": maxRead},
		}, "session", "path"),
		ToolSessionPause: obj(map[string]any{"session": str("Session name")}, "session"),
		ToolSessionFork: obj(map[string]any{
			"session": str("Session name"),
			"names":   list("Names of the new sessions ("+names.SessionRule+"); generated when absent", wire.MaxForks),
			"count":   map[string]any{"type": "integer", "minimum": 1, "maximum": wire.MaxForks, "description": "How many copies, when names are absent (default 1)"},
		}, "session"),
		ToolSessionNetLock: obj(map[string]any{
			"session": str("Session name"),
			"allow":   list("Egress rules still allowed; empty or absent: no network", maxLockRules),
		}, "session"),
		ToolReceipt: obj(map[string]any{"request_id": str("The command's request id (default: the latest command)")}),
	}
	out = obj(map[string]any{
		"exit_code":   integer("Exit code as a shell reports it: the command's own, or 128+N when signal N ended it"),
		"signal":      str("Signal that ended the command (KILL, TERM, …), if any"),
		"output":      str("stdout and stderr combined, cut at max_output_size"),
		"truncated":   boolean("Output beyond max_output_size was dropped"),
		"timed_out":   boolean("The time limit killed the command"),
		"duration_ms": integer("The command's run time in the VM, in milliseconds"),
		"total_ms":    integer("The whole call, including the wait for a VM and its start, in milliseconds"),
		"vm":          str("The VM's id"),
		"request_id":  str("The gateway's request id (request_id in its audit log)"),
		"session":     str("The session the command ran in, if any"),
	}, "exit_code", "output", "truncated", "timed_out", "duration_ms", "total_ms", "vm", "request_id")
	return in, out
}

// wireSchema is a schema as a client reads it, its required names as a
// set (sorted): property order is no part of the contract.
func wireSchema(t *testing.T, s any) any {
	t.Helper()
	v := asJSON(t, s)
	if m, ok := v.(map[string]any); ok {
		if req, ok := m["required"].([]any); ok {
			slices.SortFunc(req, func(a, b any) int { return cmp.Compare(a.(string), b.(string)) })
		}
	}
	return v
}

// TestSchemasAsWritten: tools/list gives every tool the input schema it
// had when the schemas were written by hand (names, types, required,
// descriptions, bounds, enums), and the command tools the output schema
// ExecOutput had, now that both are derived from the types.
func TestSchemasAsWritten(t *testing.T) {
	tc := connect(t, client.New(filepath.Join(t.TempDir(), "none.sock")), nil)
	res, err := tc.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	wantIn, wantOut := handSchemas()
	// The tools of background processes came after the schemas were
	// written by hand: they were derived from the start.
	derivedOnly := map[string][]string{ToolProcStart: {"command", "session"}, ToolProcOutput: {"handle", "session"},
		ToolProcInput: {"handle", "session"}, ToolProcKill: {"handle", "session"}}
	if len(res.Tools) != len(wantIn)+len(derivedOnly) {
		t.Errorf("%d tools, want %d", len(res.Tools), len(wantIn)+len(derivedOnly))
	}
	for _, tool := range res.Tools {
		if req, ok := derivedOnly[tool.Name]; ok {
			got, _ := wireSchema(t, tool.InputSchema).(map[string]any)
			if fmt.Sprint(got["required"]) != fmt.Sprint(req) {
				t.Errorf("%s requires %v, want %v", tool.Name, got["required"], req)
			}
			continue
		}
		w, ok := wantIn[tool.Name]
		if !ok {
			t.Errorf("tool %s: no schema written by hand to compare with", tool.Name)
			continue
		}
		if got, want := wireSchema(t, tool.InputSchema), wireSchema(t, w); !reflect.DeepEqual(got, want) {
			t.Errorf("%s input schema:\n got %v\nwant %v", tool.Name, got, want)
		}
		switch tool.Name {
		case shelltool.Name, ToolSessionExec:
			if got, want := wireSchema(t, tool.OutputSchema), wireSchema(t, wantOut); !reflect.DeepEqual(got, want) {
				t.Errorf("%s output schema:\n got %v\nwant %v", tool.Name, got, want)
			}
		default:
			if tool.OutputSchema != nil {
				t.Errorf("%s: output schema %v", tool.Name, tool.OutputSchema)
			}
		}
	}
}

// TestExecOutputFitsSchema: the structured content the command tools
// send (ExecOutput, its optional fields empty or not) is valid under the
// output schema they announce.
func TestExecOutputFitsSchema(t *testing.T) {
	r, err := schemaFor[ExecOutput](nil).Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []ExecOutput{
		{ExitCode: 0, Output: "hi\n", DurationMS: 3, TotalMS: 90, VM: "vm-1", RequestID: "ab12"},
		{ExitCode: 137, Signal: "KILL", Truncated: true, TimedOut: true, VM: "vm-2", RequestID: "cd34", Session: "work"},
	} {
		v := asJSON(t, o)
		if err := r.Validate(v); err != nil {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// TestParsersTakeSchemas: each parser takes an object with every
// property its schema names, and reads them (the file, fork and lock
// parsers refuse any other; session_start's and session_end's return
// the name they read): the schema's names are the ones the parser reads.
func TestParsersTakeSchemas(t *testing.T) {
	readName := func(parse func(json.RawMessage) (string, error)) func(json.RawMessage) error {
		return func(b json.RawMessage) error {
			if n, err := parse(b); err != nil || n != "s" {
				return fmt.Errorf("read %q, %v; want \"s\"", n, err)
			}
			return nil
		}
	}
	for _, c := range []struct {
		schema *jsonschema.Schema
		parse  func(json.RawMessage) error
		args   string
	}{
		{schemaFor[startArgs](nil), func(b json.RawMessage) error {
			if c, err := parseVMChoice(b); err != nil || c.image != "py" || len(c.secrets) != 1 {
				return fmt.Errorf("read %+v, %v; want image \"py\" and a secret", c, err)
			}
			return readName(parseStart)(b)
		}, `{"name":"s","image":"py","secrets":["GH_TOKEN"]}`},
		{schemaFor[imageArgs](nil), func(b json.RawMessage) error { _, err := parseVMChoice(b); return err }, `{"image":"py","secrets":["GH_TOKEN"]}`},
		{schemaFor[sessionArgs](nil), readName(parseEnd), `{"session":"s"}`},
		{schemaFor[writeArgs](nil), func(b json.RawMessage) error { _, _, _, err := parseWrite(b); return err },
			`{"session":"s","path":"/x","content":"aGk=","encoding":"base64"}`},
		{schemaFor[readArgs](nil), func(b json.RawMessage) error { _, _, _, err := parseRead(b); return err },
			`{"session":"s","path":"/x","max_bytes":10}`},
		{schemaFor[forkArgs](nil), func(b json.RawMessage) error { _, err := parseFork(b); return err },
			`{"session":"s","names":["a"],"count":0}`},
		{schemaFor[netLockArgs](nil), func(b json.RawMessage) error { _, err := parseNetLock(b); return err },
			`{"session":"s","allow":["example.com:443"]}`},
		{schemaFor[receiptArgs](nil), func(b json.RawMessage) error { _, err := parseReceiptArgs(b); return err },
			`{"request_id":"ab12"}`},
	} {
		var m map[string]any
		if err := json.Unmarshal([]byte(c.args), &m); err != nil {
			t.Fatal(err)
		}
		keys, props := slices.Sorted(maps.Keys(m)), slices.Sorted(maps.Keys(c.schema.Properties))
		if !slices.Equal(keys, props) {
			t.Errorf("%s names %v, the schema %v", c.args, keys, props)
		}
		if err := c.parse(json.RawMessage(c.args)); err != nil {
			t.Errorf("%s: %v", c.args, err)
		}
	}
}
