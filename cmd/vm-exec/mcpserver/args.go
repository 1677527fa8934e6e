package mcpserver

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/vmgate/vmgate/internal/names"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
)

// The session tools' arguments come from a model, like exec_shell_command's:
// they are parsed here (pure, table-tested, fuzzed) and every error wraps
// shelltool.ErrArgs with a text the model can act on.

// sessionField decodes the string field key of the JSON object raw. A
// missing or null field is "" (the caller decides whether that is allowed);
// a present one must be a valid session name (names.Session).
func sessionField(raw json.RawMessage, key string) (string, error) {
	m, err := object(raw)
	if err != nil {
		return "", err
	}
	v, ok := m[key]
	if !ok || bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		return "", nil
	}
	var name string
	if err := json.Unmarshal(v, &name); err != nil {
		return "", fmt.Errorf("%w: %q must be a string", shelltool.ErrArgs, key)
	}
	if !names.Session(name) {
		return "", fmt.Errorf("%w: %q: %q is not a session name (%s)", shelltool.ErrArgs, key, name, names.SessionRule)
	}
	return name, nil
}

// object decodes raw as a JSON object; nothing or null is an empty one.
func object(raw json.RawMessage) (map[string]json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		raw = []byte("{}")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object: %v", shelltool.ErrArgs, err)
	}
	return m, nil
}

// requiredSession is sessionField for a field that must be present.
func requiredSession(raw json.RawMessage, key string) (string, error) {
	name, err := sessionField(raw, key)
	if err == nil && name == "" {
		err = fmt.Errorf("%w: %q is missing", shelltool.ErrArgs, key)
	}
	return name, err
}

// startArgs are session_start's arguments (parseStart, parseVMChoice):
// the schema's source.
type startArgs struct {
	Name    string   `json:"name,omitempty"` // its description holds names.SessionRule
	Image   string   `json:"image,omitempty" jsonschema:"Image the session's VM runs, one the operator allows (default: the usual one); the session keeps it"`
	Secrets []string `json:"secrets,omitempty" jsonschema:"Names of the operator's secrets the session's commands get: each variable holds a placeholder that the VM's network replaces with the real value, only in requests to that secret's hosts"`
}

// imageArgs is what exec_shell_command adds to shelltool's arguments
// (parseVMChoice): the source of its part of the schema.
type imageArgs struct {
	Image   string   `json:"image,omitempty" jsonschema:"Image the VM runs, one the operator allows (default: the usual one)"`
	Secrets []string `json:"secrets,omitempty" jsonschema:"Names of the operator's secrets the command gets: each variable holds a placeholder that the VM's network replaces with the real value, only in requests to that secret's hosts"`
}

// vmChoice is what a tool call chooses of its VM: an image ("": the
// operator's default) and secrets.
type vmChoice struct {
	image   string
	secrets []string
}

// parseVMChoice decodes the optional "image" and "secrets" of
// exec_shell_command's and session_start's arguments: a present image
// must be a name an image can have (names.Image), each secret a
// variable's name (names.EnvVar); the daemon's policy decides whether
// they are allowed.
func parseVMChoice(raw json.RawMessage) (vmChoice, error) {
	var c vmChoice
	m, err := object(raw)
	if err != nil {
		return c, err
	}
	if v, ok := m["image"]; ok && !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		if err := json.Unmarshal(v, &c.image); err != nil {
			return c, fmt.Errorf("%w: \"image\" must be a string", shelltool.ErrArgs)
		}
		if !names.Image(c.image) {
			return c, fmt.Errorf("%w: \"image\": %q is not an image name (%s)", shelltool.ErrArgs, c.image, names.ImageRule)
		}
	}
	if v, ok := m["secrets"]; ok && !bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
		if err := json.Unmarshal(v, &c.secrets); err != nil {
			return c, fmt.Errorf("%w: \"secrets\" must be an array of names", shelltool.ErrArgs)
		}
		for _, n := range c.secrets {
			if !names.EnvVar(n) {
				return c, fmt.Errorf("%w: \"secrets\": %q is not a secret's name (%s)", shelltool.ErrArgs, n, names.EnvVarRule)
			}
		}
	}
	return c, nil
}

// execSchema is exec_shell_command's input schema: shelltool's (written
// by hand: it mirrors llama.cpp's tool) with imageArgs' property.
func execSchema() map[string]any {
	s := shelltool.Schema()
	props := s["properties"].(map[string]any)
	for k, p := range schemaFor[imageArgs](nil).Properties {
		props[k] = p
	}
	return s
}

// parseStart decodes session_start's arguments: an optional "name". An
// empty result means "generate one".
func parseStart(raw json.RawMessage) (string, error) { return sessionField(raw, "name") }

// sessionArgs are the arguments of a tool that takes a session and
// nothing else, session_end's and session_pause's (requiredSession): the
// schema's source.
type sessionArgs struct {
	Session string `json:"session" jsonschema:"Session name"`
}

// parseSessionExec decodes session_exec's arguments: "session" plus
// exec_shell_command's own, parsed by shelltool.ParseArgs.
func parseSessionExec(raw json.RawMessage) (string, shelltool.Args, error) {
	name, err := requiredSession(raw, "session")
	if err != nil {
		return "", shelltool.Args{}, err
	}
	a, err := shelltool.ParseArgs(raw)
	if err != nil {
		return "", shelltool.Args{}, err
	}
	return name, a, nil
}

// parseEnd decodes session_end's arguments: "session".
func parseEnd(raw json.RawMessage) (string, error) { return requiredSession(raw, "session") }

// sessionNamePrefix starts the names of generated sessions, so that
// `vm-exec --list-sessions` shows which sessions an MCP server made.
const sessionNamePrefix = "mcp-"

// newSessionName returns a fresh random session name.
func newSessionName() string {
	b := make([]byte, 5)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return sessionNamePrefix + hex.EncodeToString(b)
}

// sessionExecArgs is what session_exec adds to exec_shell_command's
// arguments (parseSessionExec): the source of its part of the schema.
type sessionExecArgs struct {
	Session string `json:"session" jsonschema:"Session name returned by session_start"`
}

// sessionExecSchema is session_exec's input schema: exec_shell_command's
// (written by hand: it mirrors llama.cpp's tool) with sessionExecArgs'
// properties, required before its own.
func sessionExecSchema() map[string]any {
	s := shelltool.Schema()
	own := schemaFor[sessionExecArgs](nil)
	props := s["properties"].(map[string]any)
	for k, p := range own.Properties {
		props[k] = p
	}
	s["required"] = append(own.Required, s["required"].([]string)...)
	return s
}
