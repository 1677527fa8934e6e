package mcpserver

import (
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
)

// Schemas come from types. A tool's input schema is derived from the type
// its arguments decode into, and the command tools' output schema from
// ExecOutput, the value their structured content is (jsonschema.For):
// property names from the json tags, types from the Go types, required
// from the fields without omitempty, descriptions from the jsonschema
// tags. What a tag cannot say (bounds and enums, texts made of
// constants) is added beside the type, from the constants its parser
// checks. exec_shell_command's schema is the one written by hand
// (shelltool.Schema): it mirrors llama.cpp's built-in tool.
//
// Two of jsonschema's defaults are undone, so that the schemas state the
// canonical form, as the hand-written one does: a struct's schema does
// not forbid other properties (the file, fork and lock tools' parsers
// refuse them, the others ignore them), and an optional pointer or slice
// field has its one type, not also null (every parser takes null as
// absent, a leniency for models like shelltool's).
//
// The tools are added with Server.AddTool, not the SDK's typed
// mcp.AddTool: the typed form would validate arguments against the
// schema before the parsers see them, and refuse what they accept (a
// timeout given as "10") with its own texts instead of theirs.

// schemaFor is T's schema as a tool's input or output schema (see above);
// edit, if set, adds to its properties what tags cannot say.
func schemaFor[T any](edit func(props map[string]*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		// T is one of this package's types: every test that lists the
		// tools fails here first.
		panic(fmt.Sprintf("mcpserver: schema: %v", err))
	}
	s.AdditionalProperties = nil
	for _, p := range s.Properties {
		if len(p.Types) == 2 && p.Types[0] == "null" {
			p.Type, p.Types = p.Types[1], nil
		}
	}
	if edit != nil {
		edit(s.Properties)
	}
	return s
}

func float(n int) *float64 { return ptr(float64(n)) }
