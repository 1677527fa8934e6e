package agent

import (
	"errors"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

func TestMergeEnv(t *testing.T) {
	got := mergeEnv(
		[]string{"PATH=/bin", "HOME=/root", "LANG=C"},
		[]string{"LANG=de", "A=1"},
		[]string{"A=2", "B=", "PATH=/x:/y"},
	)
	want := []string{"PATH=/x:/y", "HOME=/root", "LANG=de", "A=2", "B="}
	if !slices.Equal(got, want) {
		t.Fatalf("mergeEnv = %q, want %q", got, want)
	}
	if v := envValue(got, "PATH"); v != "/x:/y" {
		t.Errorf("envValue(PATH) = %q", v)
	}
	if v := envValue(got, "MISSING"); v != "" {
		t.Errorf("envValue(MISSING) = %q", v)
	}
}

func TestBuildEnv(t *testing.T) {
	id := identity{name: "agent", home: "/home/agent", shell: "/bin/bash"}
	got := buildEnv(id, "xterm", []string{"X=1"}, []string{"X=2", "LANG=C"})
	want := []string{
		"PATH=" + basePath, "HOME=/home/agent", "USER=agent", "LOGNAME=agent",
		"SHELL=/bin/bash", "LANG=C", "TERM=xterm", "X=2",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("buildEnv = %q, want %q", got, want)
	}
	if got := buildEnv(id, "", nil, nil); slices.ContainsFunc(got, func(kv string) bool { return kv[:5] == "TERM=" }) {
		t.Errorf("TERM without a pty: %q", got)
	}
}

func TestWorkDir(t *testing.T) {
	home := t.TempDir()
	missing := filepath.Join(home, "missing")
	for _, tc := range []struct{ dir, home, want string }{
		{"", home, home},
		{"", missing, "/"},
		{"", "", "/"},
		{"/srv/../tmp", home, "/tmp"},
		{"sub/dir", home, filepath.Join(home, "sub/dir")},
		{"sub", missing, "/sub"},
	} {
		if got := workDir(tc.dir, tc.home); got != tc.want {
			t.Errorf("workDir(%q, %q) = %q, want %q", tc.dir, tc.home, got, tc.want)
		}
	}
}

func TestCheckDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkDir(dir); err != nil {
		t.Errorf("checkDir(dir) = %v", err)
	}
	if err := checkDir(file); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("checkDir(file) = %v, want ENOTDIR", err)
	}
	if err := checkDir(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("checkDir(missing) = %v, want not exist", err)
	}
}

func TestLookPath(t *testing.T) {
	root := identity{name: "root"}
	dir := t.TempDir()
	mk := func(rel string, mode os.FileMode) string {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noexec := mk("a/tool", 0o644)
	exe := mk("b/tool", 0o755)
	rel := mk("work/bin/relprog", 0o755)
	if err := os.Mkdir(filepath.Join(dir, "c"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "c", "tool"), 0o755); err != nil { // a directory is no program
		t.Fatal(err)
	}
	a, b, c := filepath.Join(dir, "a"), filepath.Join(dir, "b"), filepath.Join(dir, "c")
	for _, tc := range []struct {
		name, path, dir, want string
		err                   error
	}{
		{"tool", a + ":" + b, "/", exe, nil},
		{"tool", c + ":" + b, "/", exe, nil},
		{"tool", a, "/", noexec, nil}, // only a non-executable file: exec reports why
		{"tool", c, "/", "", errNotFound},
		{"tool", "", "/", "", errNotFound},
		{"missing", a + ":" + b, "/", "", errNotFound},
		{"relprog", "bin", filepath.Join(dir, "work"), rel, nil},
		{"relprog", ":" + a, filepath.Join(dir, "work", "bin"), rel, nil},
		{"./x/y", "", "/", "./x/y", nil},
		{"/abs/prog", "", "/", "/abs/prog", nil},
	} {
		got, err := lookPath(tc.name, tc.path, tc.dir, root)
		if got != tc.want || !errors.Is(err, tc.err) {
			t.Errorf("lookPath(%q, %q, %q) = %q, %v; want %q, %v", tc.name, tc.path, tc.dir, got, err, tc.want, tc.err)
		}
	}
}

// fakeFileInfo is a regular file with the given owner and permissions.
type fakeFileInfo struct {
	mode     fs.FileMode
	uid, gid uint32
}

func (f fakeFileInfo) Name() string       { return "f" }
func (f fakeFileInfo) Size() int64        { return 0 }
func (f fakeFileInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeFileInfo) ModTime() time.Time { return time.Time{} }
func (f fakeFileInfo) IsDir() bool        { return false }
func (f fakeFileInfo) Sys() any           { return &syscall.Stat_t{Uid: f.uid, Gid: f.gid} }

func TestExecutableBy(t *testing.T) {
	root := identity{uid: 0, gid: 0}
	user := identity{uid: 1000, gid: 1000, groups: []uint32{1000, 27}}
	for _, tc := range []struct {
		fi         fakeFileInfo
		root, user bool
	}{
		{fakeFileInfo{0o755, 0, 0}, true, true},
		{fakeFileInfo{0o700, 0, 0}, true, false},
		{fakeFileInfo{0o644, 0, 0}, false, false},
		{fakeFileInfo{0o100, 1000, 0}, true, true},
		{fakeFileInfo{0o010, 0, 27}, true, true},       // supplementary group
		{fakeFileInfo{0o010, 0, 1000}, true, true},     // primary group
		{fakeFileInfo{0o001, 1000, 1000}, true, false}, // owner bits apply, not other
		{fakeFileInfo{0o001, 5, 5}, true, true},
	} {
		if got := executableBy(tc.fi, root); got != tc.root {
			t.Errorf("%+v by root = %v", tc.fi, got)
		}
		if got := executableBy(tc.fi, user); got != tc.user {
			t.Errorf("%+v by user = %v", tc.fi, got)
		}
	}
}

func TestLoginShell(t *testing.T) {
	passwd := filepath.Join(t.TempDir(), "passwd")
	content := "root:x:0:0:root:/root:/bin/bash\n" +
		"agent:x:1000:1000::/home/agent:/bin/zsh\n" +
		"noshell:x:1001:1001::/home/noshell:\n" +
		"broken line\n"
	if err := os.WriteFile(passwd, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"root": "/bin/bash", "agent": "/bin/zsh", "noshell": defaultShell, "nobody": defaultShell,
	} {
		if got := loginShell(passwd, name); got != want {
			t.Errorf("loginShell(%q) = %q, want %q", name, got, want)
		}
	}
	if got := loginShell(filepath.Join(t.TempDir(), "missing"), "root"); got != defaultShell {
		t.Errorf("missing passwd: %q", got)
	}
}

func TestLookupIdentity(t *testing.T) {
	for _, name := range []string{"", "root"} {
		id, err := lookupIdentity(name, nil)
		if err != nil || id.name != "root" || id.switchCred || id.uid != uint32(os.Geteuid()) {
			t.Errorf("lookupIdentity(%q) = %+v, %v", name, id, err)
		}
	}
	if _, err := lookupIdentity("vmgate-no-such-user", nil); !errors.Is(err, errUnknownUser) || !strings.Contains(err.Error(), `"vmgate-no-such-user"`) {
		t.Errorf("lookupIdentity of a missing account: %v, want errUnknownUser naming it", err)
	}
	// Any account of the guest's, not only the unprivileged user.
	if u, err := user.Lookup("nobody"); err == nil {
		id, err := lookupIdentity("nobody", nil)
		if err != nil || !id.switchCred || id.name != "nobody" || strconv.FormatUint(uint64(id.uid), 10) != u.Uid {
			t.Errorf("lookupIdentity(nobody) = %+v, %v", id, err)
		}
	}
	id, err := lookupIdentity(agentproto.UnprivilegedUser, nil)
	if err != nil {
		t.Logf("no %s user here: %v", agentproto.UnprivilegedUser, err)
		return
	}
	if !id.switchCred || id.name != agentproto.UnprivilegedUser {
		t.Errorf("lookupIdentity(agent) = %+v", id)
	}
}

// fakeAccounts is an account database holding only the unprivileged user,
// with uid and gid as given.
func fakeAccounts(uid, gid string) lookupUserFunc {
	return fakeAccountsOf(agentproto.UnprivilegedUser, uid, gid)
}

// fakeAccountsOf is an account database holding only the account name,
// with uid and gid as given.
func fakeAccountsOf(name, uid, gid string) lookupUserFunc {
	return func(n string) (*user.User, error) {
		if n != name {
			return nil, user.UnknownUserError(n)
		}
		return &user.User{Uid: uid, Gid: gid, Username: n, HomeDir: "/home/" + n}, nil
	}
}

// TestLookupIdentityRefusesRoot: an account other than root that is
// root's (uid 0 or gid 0, as an imported root file system may have it) is
// refused, never a root command under another name: the unprivileged
// user, or any other.
func TestLookupIdentityRefusesRoot(t *testing.T) {
	for _, name := range []string{agentproto.UnprivilegedUser, "toor", "builder"} {
		for _, tc := range []struct{ uid, gid string }{{"0", "0"}, {"0", "1000"}, {"1000", "0"}} {
			id, err := lookupIdentity(name, fakeAccountsOf(name, tc.uid, tc.gid))
			if !errors.Is(err, errPrivilegedUser) {
				t.Errorf("%s, uid %s gid %s: %+v, %v; want errPrivilegedUser", name, tc.uid, tc.gid, id, err)
			}
		}
	}
	if id, err := lookupIdentity("builder", fakeAccountsOf("builder", "1001", "1001")); err != nil || id.uid != 1001 || !id.switchCred {
		t.Errorf("an ordinary account: %+v, %v", id, err)
	}
	if _, err := lookupIdentity(agentproto.UnprivilegedUser, fakeAccounts("x", "1000")); err == nil || errors.Is(err, errPrivilegedUser) {
		t.Errorf("a bad uid: %v", err)
	}
}

func TestStartFailure(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code uint32
		msg  string
	}{
		{errNotFound, 127, "vmgate-agent: prog: command not found\n"},
		{&fs.PathError{Op: "fork/exec", Path: "/x", Err: syscall.ENOENT}, 127, "vmgate-agent: prog: no such file or directory\n"},
		{&fs.PathError{Op: "fork/exec", Path: "/x", Err: syscall.EACCES}, 126, "vmgate-agent: prog: permission denied\n"},
		{&fs.PathError{Op: "fork/exec", Path: "/x", Err: syscall.ENOEXEC}, 126, "vmgate-agent: prog: exec format error\n"},
		{errors.New("odd"), 126, "vmgate-agent: prog: odd\n"},
	} {
		code, msg := startFailure("prog", tc.err)
		if code != tc.code || msg != tc.msg {
			t.Errorf("startFailure(%v) = %d, %q; want %d, %q", tc.err, code, msg, tc.code, tc.msg)
		}
	}
}

func TestSignals(t *testing.T) {
	for _, name := range []string{"ABRT", "ALRM", "FPE", "HUP", "ILL", "INT", "KILL", "PIPE", "QUIT", "SEGV", "TERM", "USR1", "USR2"} {
		sig, ok := parseSignal(name)
		if !ok {
			t.Errorf("parseSignal(%q) failed", name)
			continue
		}
		if got := signalName(sig); got != name {
			t.Errorf("signalName(%v) = %q, want %q", sig, got, name)
		}
	}
	for _, bad := range []string{"", "SIGTERM", "term", "STOP", "9"} {
		if _, ok := parseSignal(bad); ok {
			t.Errorf("parseSignal(%q) succeeded", bad)
		}
	}
	if got := signalName(syscall.SIGBUS); got != "BUS" {
		t.Errorf("signalName(SIGBUS) = %q", got)
	}
	if got := signalName(syscall.Signal(40)); got != "40" {
		t.Errorf("signalName(40) = %q", got)
	}
}
