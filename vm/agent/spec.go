package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/vmgate/vmgate/vm/agentproto"
)

// maxSpecBytes bounds the JSON document of one ExecRequest. SSH packets are
// smaller than this anyway; the limit only documents the expectation.
const maxSpecBytes = 1 << 20

// decodeExecSpec parses the JSON document of an ExecRequest and validates
// it. Unknown fields are rejected: a newer host may add fields whose meaning
// this agent does not implement, and silently ignoring them could run a
// command under weaker conditions than the host asked for.
func decodeExecSpec(data []byte) (agentproto.ExecSpec, error) {
	if len(data) > maxSpecBytes {
		return agentproto.ExecSpec{}, fmt.Errorf("decode exec spec: %d bytes exceeds the limit of %d", len(data), maxSpecBytes)
	}
	var spec agentproto.ExecSpec
	if err := decodeJSON(data, &spec); err != nil {
		return agentproto.ExecSpec{}, fmt.Errorf("decode exec spec: %w", err)
	}
	if err := validateExecSpec(spec); err != nil {
		return agentproto.ExecSpec{}, err
	}
	return spec, nil
}

// decodeJSON decodes exactly one JSON value from data into v, rejecting
// unknown object fields and trailing data.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

// validateExecSpec checks the invariants of an ExecSpec: a non-empty argv
// with a non-empty program name, no NUL bytes anywhere, KEY=VALUE
// environment entries and an allowed user.
func validateExecSpec(spec agentproto.ExecSpec) error {
	if len(spec.Argv) == 0 {
		return errors.New("invalid exec spec: argv is empty")
	}
	if spec.Argv[0] == "" {
		return errors.New("invalid exec spec: argv[0] is empty")
	}
	for i, a := range spec.Argv {
		if hasNUL(a) {
			return fmt.Errorf("invalid exec spec: argv[%d] contains a NUL byte", i)
		}
	}
	for i, kv := range spec.Env {
		if err := validateEnvEntry(kv); err != nil {
			return fmt.Errorf("invalid exec spec: env[%d]: %w", i, err)
		}
	}
	if hasNUL(spec.Dir) {
		return errors.New("invalid exec spec: dir contains a NUL byte")
	}
	if !allowedUser(spec.User) {
		return fmt.Errorf("invalid exec spec: user %q is not allowed (want %q, %q or empty)",
			spec.User, "root", agentproto.UnprivilegedUser)
	}
	return nil
}

// allowedUser reports whether name may be used as ExecSpec.User.
func allowedUser(name string) bool {
	return name == "" || name == "root" || name == agentproto.UnprivilegedUser
}

// validateEnvEntry checks one KEY=VALUE environment entry.
func validateEnvEntry(kv string) error {
	name, value, ok := strings.Cut(kv, "=")
	if !ok {
		return errors.New("entry is not KEY=VALUE")
	}
	return validateEnvVar(name, value)
}

// validateEnvVar checks a variable name and value as they arrive in an "env"
// request or an ExecSpec entry.
func validateEnvVar(name, value string) error {
	switch {
	case name == "":
		return errors.New("empty variable name")
	case strings.Contains(name, "="):
		return errors.New("variable name contains '='")
	case hasNUL(name) || hasNUL(value):
		return errors.New("variable contains a NUL byte")
	}
	return nil
}

func hasNUL(s string) bool { return strings.IndexByte(s, 0) >= 0 }
