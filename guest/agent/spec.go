package agent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/tty"
)

// validateOpen checks a command the host opened a channel for (decoded
// strictly by package agentconn: unknown fields are rejected, since a
// newer host may add fields whose meaning this agent does not implement,
// and silently ignoring them could run a command under weaker conditions
// than the host asked for): its ExecSpec and, if any, its terminal.
func validateOpen(o agentproto.Open) error {
	if err := validateExecSpec(o.Spec); err != nil {
		return err
	}
	if p := o.PTY; p != nil {
		if !tty.SizeOK(p.Columns, p.Rows) || !tty.NameOK(p.Term) {
			return errors.New("invalid terminal: size or type out of bounds")
		}
		if err := validateEnvVar("TERM", p.Term); err != nil {
			return fmt.Errorf("invalid terminal: %w", err)
		}
	}
	return nil
}

// validateExecSpec checks the invariants of an ExecSpec: a non-empty argv
// with a non-empty program name, no NUL bytes anywhere, KEY=VALUE
// environment entries and a user name that an account could have.
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
	if !validUserName(spec.User) {
		return fmt.Errorf("invalid exec spec: user %q is not an account name", spec.User)
	}
	return nil
}

// validUserName reports whether name may be used as ExecSpec.User: empty
// (root) or a name the account database could hold (at most
// agentproto.MaxUserName bytes, none of them NUL, ':' or a newline).
// Whether the guest has the account is the lookup's question.
func validUserName(name string) bool {
	return len(name) <= agentproto.MaxUserName && !strings.ContainsAny(name, "\x00:\n")
}

// validateEnvEntry checks one KEY=VALUE environment entry.
func validateEnvEntry(kv string) error {
	name, value, ok := strings.Cut(kv, "=")
	if !ok {
		return errors.New("entry is not KEY=VALUE")
	}
	return validateEnvVar(name, value)
}

// validateEnvVar checks a variable name and value (an ExecSpec entry, a
// terminal's TERM).
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
