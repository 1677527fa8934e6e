package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// basePath is the PATH every command starts with.
const basePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// passwdPath is the account database read for login shells.
const passwdPath = "/etc/passwd"

// defaultShell is used when an account has no login shell.
const defaultShell = "/bin/sh"

// errNotFound reports that a program name was not found in PATH.
var errNotFound = errors.New("command not found")

// identity is the account a command runs as.
type identity struct {
	name   string
	uid    uint32
	gid    uint32
	groups []uint32
	home   string
	shell  string
	// switchCred is set when the command must run with uid, gid and groups
	// instead of the agent's own credentials.
	switchCred bool
}

// lookupUserFunc finds an account by name (user.Lookup; tests pass a fake
// account database).
type lookupUserFunc func(name string) (*user.User, error)

// lookupIdentity resolves an ExecSpec user ("" meaning root). Root commands
// keep the agent's own credentials (root in the guest); any other account's
// uid, gid and supplementary groups come from the account database through
// lookup (nil: user.Lookup).
//
// An account other than root must be unprivileged: an account database
// that gives it uid 0 or gid 0 (an imported root file system may have its
// own "agent" entry, or a "toor") is an error, never a root command under
// another name. An account the guest does not have is errUnknownUser.
func lookupIdentity(name string, lookup lookupUserFunc) (identity, error) {
	if name == "" || name == "root" {
		return rootIdentity(), nil
	}
	if lookup == nil {
		lookup = user.Lookup
	}
	u, err := lookup(name)
	if err != nil {
		var unknown user.UnknownUserError
		if errors.As(err, &unknown) {
			return identity{}, fmt.Errorf("user %q: %w", name, errUnknownUser)
		}
		return identity{}, fmt.Errorf("look up user %q: %w", name, err)
	}
	id := identity{name: u.Username, home: u.HomeDir, shell: loginShell(passwdPath, u.Username), switchCred: true}
	if id.uid, err = parseID(u.Uid); err != nil {
		return identity{}, fmt.Errorf("user %s: uid: %w", name, err)
	}
	if id.gid, err = parseID(u.Gid); err != nil {
		return identity{}, fmt.Errorf("user %s: gid: %w", name, err)
	}
	if id.uid == 0 || id.gid == 0 {
		return identity{}, fmt.Errorf("user %s has uid %d, gid %d in this guest: %w", name, id.uid, id.gid, errPrivilegedUser)
	}
	gids, err := u.GroupIds()
	if err != nil {
		return identity{}, fmt.Errorf("user %s: groups: %w", name, err)
	}
	for _, g := range gids {
		gid, err := parseID(g)
		if err != nil {
			return identity{}, fmt.Errorf("user %s: group: %w", name, err)
		}
		id.groups = append(id.groups, gid)
	}
	return id, nil
}

// errPrivilegedUser reports an account other than root that is root's in
// disguise.
var errPrivilegedUser = errors.New("it is root's, not an unprivileged user: refusing to run the command as it")

// errUnknownUser reports an account the guest does not have.
var errUnknownUser = errors.New("no such account in this guest")

// rootIdentity describes root commands, which run with the agent's own
// credentials; HOME and SHELL come from root's account when it exists.
func rootIdentity() identity {
	id := identity{name: "root", home: "/", shell: loginShell(passwdPath, "root")}
	id.uid, id.gid = uint32(os.Geteuid()), uint32(os.Getegid())
	if gids, err := os.Getgroups(); err == nil {
		for _, g := range gids {
			id.groups = append(id.groups, uint32(g))
		}
	}
	if u, err := user.Lookup("root"); err == nil && u.HomeDir != "" {
		id.home = u.HomeDir
	}
	return id
}

func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("parse id %q: %w", s, err)
	}
	return uint32(n), nil
}

// loginShell returns the login shell of name in the passwd file at path,
// or defaultShell. (os/user does not expose the shell field.)
func loginShell(path, name string) string {
	f, err := os.Open(path)
	if err != nil {
		return defaultShell
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) == 7 && fields[0] == name && fields[6] != "" {
			return fields[6]
		}
	}
	return defaultShell
}

// inGroup reports whether the identity is a member of gid.
func (id identity) inGroup(gid uint32) bool {
	return id.gid == gid || slices.Contains(id.groups, gid)
}

// buildEnv returns a command's environment: the base variables, then the
// session's "env" requests, then the ExecSpec entries; later entries replace
// earlier ones with the same name. term is set as TERM when non-empty.
func buildEnv(id identity, term string, requested, spec []string) []string {
	base := []string{
		"PATH=" + basePath,
		"HOME=" + id.home,
		"USER=" + id.name,
		"LOGNAME=" + id.name,
		"SHELL=" + id.shell,
		"LANG=C.UTF-8",
	}
	if term != "" {
		base = append(base, "TERM="+term)
	}
	return mergeEnv(base, requested, spec)
}

// mergeEnv concatenates KEY=VALUE lists; a later entry replaces an earlier
// one with the same key in place.
func mergeEnv(lists ...[]string) []string {
	var out []string
	index := make(map[string]int)
	for _, list := range lists {
		for _, kv := range list {
			key, _, _ := strings.Cut(kv, "=")
			if i, ok := index[key]; ok {
				out[i] = kv
				continue
			}
			index[key] = len(out)
			out = append(out, kv)
		}
	}
	return out
}

// envValue returns the value of key in a KEY=VALUE list.
func envValue(env []string, key string) string {
	for _, kv := range slices.Backward(env) {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// workDir returns the working directory of a command: dir, resolved against
// home when relative, or home itself when dir is empty. A home directory
// that does not exist is replaced by "/".
func workDir(dir, home string) string {
	if home == "" || !isDir(home) {
		home = "/"
	}
	switch {
	case dir == "":
		return home
	case filepath.IsAbs(dir):
		return filepath.Clean(dir)
	default:
		return filepath.Join(home, dir)
	}
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// checkDir verifies that dir is an existing directory.
func checkDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &fs.PathError{Op: "chdir", Path: dir, Err: syscall.ENOTDIR}
	}
	return nil
}

// lookPath finds the program of argv[0] the way a shell does. A name with a
// slash is used as is (relative to the working directory). Otherwise each
// PATH entry is searched (empty and relative entries relative to dir) for a
// regular file that id may execute. If only files id may not execute are
// found, the first is returned so that starting it reports why it cannot
// run; if nothing is found the error is errNotFound.
func lookPath(name, pathList, dir string, id identity) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	var denied string
	for _, d := range filepath.SplitList(pathList) {
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if executableBy(fi, id) {
			return p, nil
		}
		if denied == "" {
			denied = p
		}
	}
	if denied != "" {
		return denied, nil
	}
	return "", errNotFound
}

// executableBy reports whether the permission bits of fi let id execute it.
// Root may execute a file with any execute bit set.
func executableBy(fi fs.FileInfo, id identity) bool {
	perm := fi.Mode().Perm()
	st, ok := fi.Sys().(*syscall.Stat_t)
	if id.uid == 0 || !ok {
		return perm&0o111 != 0
	}
	switch {
	case st.Uid == id.uid:
		return perm&0o100 != 0
	case id.inGroup(st.Gid):
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// newCommand builds the exec.Cmd of a command. It runs in its own process
// group, or in its own session when it gets a controlling terminal (pty), so
// that signals and the final SIGKILL reach all its processes.
func newCommand(path string, argv, env []string, dir string, id identity, pty bool) *exec.Cmd {
	attr := &syscall.SysProcAttr{Setpgid: true}
	if pty {
		// The pty's slave end is the child's stdin (fd 0).
		attr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	}
	if id.switchCred {
		attr.Credential = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
	}
	return &exec.Cmd{
		Path:        path,
		Args:        slices.Clone(argv),
		Env:         env,
		Dir:         dir,
		SysProcAttr: attr,
		WaitDelay:   waitDelay,
	}
}

// startFailure returns the exit code and stderr line for a command that could
// not be started, as a shell reports them: 127 when the program does not
// exist, 126 when it exists but cannot be executed.
func startFailure(name string, err error) (code uint32, msg string) {
	if errors.Is(err, errNotFound) {
		return agentproto.ExitNotFound, fmt.Sprintf("vmgate-agent: %s: command not found\n", name)
	}
	code = agentproto.ExitNotExecutable
	if errors.Is(err, fs.ErrNotExist) {
		code = agentproto.ExitNotFound
	}
	return code, fmt.Sprintf("vmgate-agent: %s: %s\n", name, errReason(err))
}

// dirFailure returns the exit code and stderr line for a working directory
// that cannot be used.
func dirFailure(dir string, err error) (code uint32, msg string) {
	return agentproto.ExitNotExecutable, fmt.Sprintf("vmgate-agent: cd %s: %s\n", dir, errReason(err))
}

// userFailure returns the exit code and stderr line for a command whose
// user cannot be used.
func userFailure(err error) (code uint32, msg string) {
	return agentproto.ExitNotExecutable, fmt.Sprintf("vmgate-agent: %s\n", err)
}

// errReason returns the errno text of err when it wraps one ("permission
// denied"), else the whole error text.
func errReason(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return err.Error()
}
