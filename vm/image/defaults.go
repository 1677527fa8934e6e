package image

import (
	"strings"

	"github.com/vmgate/vmgate/internal/names"
)

// A container image's configuration counts: its Env, WorkingDir and User
// are the defaults of commands in it, as a container runtime makes them
// the defaults of a container's processes. The policy decides what a
// caller may pass, and which users a command may run as; the image's own
// entries are the operator's, who imported it.

// CommandEnv is the environment a command in the image gets on top of
// the guest agent's base (PATH, HOME, USER, LOGNAME, SHELL, LANG, TERM):
// the image's Env, then env (the caller's entries, as the policy passed
// them), a later entry replacing an earlier one of the same name in
// place. An entry of the image's that is not NAME=VALUE, or holds a NUL,
// is left out. s may be nil (an image without a source). Pure; env is
// not changed.
func (s *Source) CommandEnv(env []string) []string {
	if s == nil || len(s.Env) == 0 {
		return env
	}
	var out []string
	index := map[string]int{}
	add := func(kv string) {
		name, _, _ := strings.Cut(kv, "=")
		if i, ok := index[name]; ok {
			out[i] = kv
			return
		}
		index[name] = len(out)
		out = append(out, kv)
	}
	for _, kv := range s.Env {
		if name, _, ok := strings.Cut(kv, "="); ok && name != "" && !strings.ContainsRune(kv, 0) {
			add(kv)
		}
	}
	for _, kv := range env {
		add(kv)
	}
	return out
}

// CommandDir is the working directory of a command in the image that
// asks for dir: dir, or when it asks for none the image's WorkingDir
// ("" for neither: the guest user's home, as the agent decides). A
// WorkingDir that is not an absolute path is left out. s may be nil.
// Pure.
func (s *Source) CommandDir(dir string) string {
	if dir != "" || s == nil || !strings.HasPrefix(s.WorkingDir, "/") || strings.ContainsRune(s.WorkingDir, 0) {
		return dir
	}
	return s.WorkingDir
}

// CommandUser is the guest account a command in the image runs as by
// default, as its configuration names it: User ("name", or "name:group",
// whose group is the account's own in the guest), "" when it names none
// or names it by number ("1000", "1000:1000"), which is no account name.
// The policy decides whether it is used (one of the profile's users). s
// may be nil. Pure.
func (s *Source) CommandUser() string {
	if s == nil {
		return ""
	}
	name, _, _ := strings.Cut(s.User, ":")
	if !names.Account(name) {
		return ""
	}
	return name
}

// LoginShell is the argv of an interactive login shell in the image (the
// SSH front door's session without a command): "bash -l", or "sh -l" for
// a root imported without bash (BusyBox, Alpine, distroless roots with a
// shell). An image built by vmgate, or imported before its shell was
// recorded, has bash. s may be nil. Pure.
func (s *Source) LoginShell() []string {
	if s != nil && s.Shell == ShellSh {
		return []string{"sh", "-l"}
	}
	return []string{"bash", "-l"}
}

// LoginCommand is the argv that runs the shell string cmd in the image's
// login shell: bash -l -c CMD, or sh -c CMD in a root without bash (as
// sh -c, the string a shell request runs).
func (s *Source) LoginCommand(cmd string) []string {
	if s != nil && s.Shell == ShellSh {
		return []string{"sh", "-c", cmd}
	}
	return []string{"bash", "-l", "-c", cmd}
}
