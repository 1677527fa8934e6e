package agent

import (
	"bytes"
	"encoding/json"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

// fsRun runs the fs subcommand as FSArgv builds it.
func fsRun(t *testing.T, stdin string, op string, o agentproto.FSOptions, paths ...string) (code int, stdout, stderr string) {
	t.Helper()
	argv := agentproto.FSArgv(op, o, paths...)
	var out, errOut bytes.Buffer
	code = FS(argv[2:], strings.NewReader(stdin), &out, &errOut)
	if code != 0 && (strings.Count(errOut.String(), "\n") != 1 || !strings.HasPrefix(errOut.String(), "vmgate-agent fs ")) {
		t.Errorf("%v: exit %d with stderr %q, want one line", argv[2:], code, errOut.String())
	}
	if code == 0 && errOut.Len() > 0 {
		t.Errorf("%v: stderr %q on success", argv[2:], errOut.String())
	}
	return code, out.String(), errOut.String()
}

// fsTree makes a tree under a new directory: a file f (5 bytes, 0640), a
// directory d with d/x and d/sub/y, an empty directory e, and a symbolic
// link l to f.
func fsTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"d/sub", "e"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{"f": "hello", "d/x": "x", "d/sub/y": "yy"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("f", filepath.Join(dir, "l")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestFSStat(t *testing.T) {
	dir := fsTree(t)
	mtime := time.Unix(1_700_000_000, 5)
	if err := os.Chtimes(filepath.Join(dir, "f"), mtime, mtime); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		want agentproto.FileEntry
	}{
		{"f", agentproto.FileEntry{Name: "f", Type: agentproto.FileRegular, Size: 5, Mode: 0o640, ModTime: mtime.UnixNano()}},
		{"d", agentproto.FileEntry{Name: "d", Type: agentproto.FileDir, Mode: 0o755}},
		{"l", agentproto.FileEntry{Name: "l", Type: agentproto.FileSymlink, Target: "f"}},
	} {
		path := filepath.Join(dir, tc.path)
		code, stdout, stderr := fsRun(t, "", agentproto.FSStat, agentproto.FSOptions{}, path)
		var e agentproto.FileEntry
		if code != 0 || json.Unmarshal([]byte(stdout), &e) != nil {
			t.Fatalf("stat %s: exit %d, %q %q", tc.path, code, stdout, stderr)
		}
		if e.Path != path || e.Name != tc.want.Name || e.Type != tc.want.Type || e.Target != tc.want.Target ||
			(tc.want.Mode != 0 && e.Mode != tc.want.Mode) || (tc.want.Size != 0 && e.Size != tc.want.Size) ||
			(tc.want.ModTime != 0 && e.ModTime != tc.want.ModTime) || e.UID != uint32(os.Getuid()) {
			t.Errorf("stat %s: %+v, want %+v", tc.path, e, tc.want)
		}
		if u, err := user.Current(); err == nil && e.Owner != u.Username {
			t.Errorf("stat %s: owner %q, want %q", tc.path, e.Owner, u.Username)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "e"), os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	_, stdout, _ := fsRun(t, "", agentproto.FSStat, agentproto.FSOptions{}, filepath.Join(dir, "e"))
	if !strings.Contains(stdout, `"mode":1023`) { // 01777
		t.Errorf("a sticky directory: %s", stdout)
	}
}

func TestFSList(t *testing.T) {
	dir := fsTree(t)
	names := func(l agentproto.FileList) string {
		var s []string
		for _, e := range l.Entries {
			rel, _ := filepath.Rel(dir, e.Path)
			s = append(s, rel+":"+e.Type)
		}
		return strings.Join(s, " ")
	}
	for _, tc := range []struct {
		o         agentproto.FSOptions
		want      string
		truncated bool
	}{
		{agentproto.FSOptions{}, "d:dir e:dir f:file l:symlink", false},
		{agentproto.FSOptions{Depth: 2}, "d:dir d/sub:dir d/x:file e:dir f:file l:symlink", false},
		{agentproto.FSOptions{Depth: 3}, "d:dir d/sub:dir d/sub/y:file d/x:file e:dir f:file l:symlink", false},
		{agentproto.FSOptions{Depth: 3, Max: 3}, "d:dir d/sub:dir d/sub/y:file", true},
		{agentproto.FSOptions{Max: 4}, "d:dir e:dir f:file l:symlink", false},
	} {
		code, stdout, stderr := fsRun(t, "", agentproto.FSList, tc.o, dir)
		var l agentproto.FileList
		if code != 0 || json.Unmarshal([]byte(stdout), &l) != nil {
			t.Fatalf("ls %+v: exit %d, %q %q", tc.o, code, stdout, stderr)
		}
		if got := names(l); got != tc.want || l.Truncated != tc.truncated {
			t.Errorf("ls %+v: %s (truncated %v), want %s (%v)", tc.o, got, l.Truncated, tc.want, tc.truncated)
		}
	}
	// An empty directory is an empty list, not null.
	if code, stdout, _ := fsRun(t, "", agentproto.FSList, agentproto.FSOptions{}, filepath.Join(dir, "e")); code != 0 || stdout != "{\"entries\":[]}\n" {
		t.Errorf("ls of an empty directory: %d %q", code, stdout)
	}
	// A link to a directory lists the directory.
	if err := os.Symlink("d", filepath.Join(dir, "ld")); err != nil {
		t.Fatal(err)
	}
	code, stdout, _ := fsRun(t, "", agentproto.FSList, agentproto.FSOptions{}, filepath.Join(dir, "ld"))
	if n := strings.Count(stdout, `"path"`); code != 0 || n != 2 {
		t.Errorf("ls of a link to a directory: %d %q", code, stdout)
	}
}

// TestFSErrors: each operation's failures and their exit codes.
func TestFSErrors(t *testing.T) {
	dir := fsTree(t)
	p := func(rel string) string { return filepath.Join(dir, rel) }
	for _, tc := range []struct {
		op    string
		o     agentproto.FSOptions
		paths []string
		code  int
	}{
		{agentproto.FSStat, agentproto.FSOptions{}, []string{p("missing")}, agentproto.FSExitNotFound},
		{agentproto.FSStat, agentproto.FSOptions{}, []string{p("f/x")}, agentproto.FSExitNotDir},
		{agentproto.FSList, agentproto.FSOptions{}, []string{p("missing")}, agentproto.FSExitNotFound},
		{agentproto.FSList, agentproto.FSOptions{}, []string{p("f")}, agentproto.FSExitNotDir},
		{agentproto.FSList, agentproto.FSOptions{Depth: agentproto.MaxListDepth + 1}, []string{dir}, agentproto.FSExitUsage},
		{agentproto.FSMkdir, agentproto.FSOptions{}, []string{p("d")}, agentproto.FSExitExists},
		{agentproto.FSMkdir, agentproto.FSOptions{}, []string{p("no/such")}, agentproto.FSExitNotFound},
		{agentproto.FSMkdir, agentproto.FSOptions{Parents: true}, []string{p("f")}, agentproto.FSExitExists},
		{agentproto.FSMkdir, agentproto.FSOptions{Parents: true}, []string{p("f/sub")}, agentproto.FSExitNotDir},
		{agentproto.FSMove, agentproto.FSOptions{}, []string{p("missing"), p("x")}, agentproto.FSExitNotFound},
		{agentproto.FSMove, agentproto.FSOptions{}, []string{p("e"), p("d")}, agentproto.FSExitExists},
		{agentproto.FSMove, agentproto.FSOptions{}, []string{p("f"), p("e")}, agentproto.FSExitIsDir},
		{agentproto.FSMove, agentproto.FSOptions{}, []string{p("e"), p("f")}, agentproto.FSExitNotDir},
		{agentproto.FSRemove, agentproto.FSOptions{}, []string{p("missing")}, agentproto.FSExitNotFound},
		{agentproto.FSRemove, agentproto.FSOptions{Recursive: true}, []string{p("missing")}, agentproto.FSExitNotFound},
		{agentproto.FSRemove, agentproto.FSOptions{}, []string{p("d")}, agentproto.FSExitIsDir},
		{agentproto.FSRead, agentproto.FSOptions{}, []string{p("missing")}, agentproto.FSExitNotFound},
		{agentproto.FSRead, agentproto.FSOptions{}, []string{p("d")}, agentproto.FSExitIsDir},
		{agentproto.FSRead, agentproto.FSOptions{Max: 4}, []string{p("f")}, agentproto.FSExitTooBig},
		{agentproto.FSWrite, agentproto.FSOptions{}, []string{p("d")}, agentproto.FSExitIsDir},
		{agentproto.FSWrite, agentproto.FSOptions{}, []string{p("no/such")}, agentproto.FSExitNotFound},
		{agentproto.FSWrite, agentproto.FSOptions{}, []string{p("f/x")}, agentproto.FSExitNotDir},
		{agentproto.FSWrite, agentproto.FSOptions{Mode: 0o10000}, []string{p("new")}, agentproto.FSExitUsage},
		{"chmod", agentproto.FSOptions{}, []string{p("f")}, agentproto.FSExitUsage},
		{agentproto.FSStat, agentproto.FSOptions{Parents: true}, []string{p("f")}, agentproto.FSExitUsage},
		{agentproto.FSMove, agentproto.FSOptions{}, []string{p("f")}, agentproto.FSExitUsage},
		{agentproto.FSStat, agentproto.FSOptions{}, []string{""}, agentproto.FSExitUsage},
	} {
		if code, _, stderr := fsRun(t, "", tc.op, tc.o, tc.paths...); code != tc.code {
			t.Errorf("%s %+v %q: exit %d (%s), want %d", tc.op, tc.o, tc.paths, code, strings.TrimSpace(stderr), tc.code)
		}
	}
	// Nothing was changed by the failures.
	if b, err := os.ReadFile(p("f")); err != nil || string(b) != "hello" {
		t.Errorf("f: %q, %v", b, err)
	}
	if _, err := os.Stat(p("d/sub/y")); err != nil {
		t.Errorf("d/sub/y: %v", err)
	}
}

func TestFSMkdirMoveRemove(t *testing.T) {
	dir := fsTree(t)
	p := func(rel string) string { return filepath.Join(dir, rel) }
	steps := []struct {
		op    string
		o     agentproto.FSOptions
		paths []string
	}{
		{agentproto.FSMkdir, agentproto.FSOptions{}, []string{p("n")}},
		{agentproto.FSMkdir, agentproto.FSOptions{Parents: true}, []string{p("a/b/c")}},
		{agentproto.FSMkdir, agentproto.FSOptions{Parents: true}, []string{p("a/b/c")}}, // exists: fine
		{agentproto.FSMove, agentproto.FSOptions{}, []string{p("f"), p("n/g")}},
		{agentproto.FSMove, agentproto.FSOptions{}, []string{p("a"), p("e")}}, // onto an empty directory
		{agentproto.FSRemove, agentproto.FSOptions{}, []string{p("l")}},       // the link, not its target
		{agentproto.FSRemove, agentproto.FSOptions{Recursive: true}, []string{p("d")}},
		{agentproto.FSRemove, agentproto.FSOptions{}, []string{p("e/b/c")}}, // an empty directory
	}
	for _, s := range steps {
		if code, _, stderr := fsRun(t, "", s.op, s.o, s.paths...); code != 0 {
			t.Fatalf("%s %q: exit %d: %s", s.op, s.paths, code, stderr)
		}
	}
	var got []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if rel, _ := filepath.Rel(dir, path); rel != "." {
			got = append(got, rel)
		}
		return nil
	})
	if want := "e e/b n n/g"; strings.Join(got, " ") != want {
		t.Errorf("the tree: %q, want %q", got, want)
	}
	if b, err := os.ReadFile(p("n/g")); err != nil || string(b) != "hello" {
		t.Errorf("the moved file: %q, %v", b, err)
	}
}

func TestFSReadWrite(t *testing.T) {
	dir := fsTree(t)
	p := func(rel string) string { return filepath.Join(dir, rel) }
	if code, stdout, _ := fsRun(t, "", agentproto.FSRead, agentproto.FSOptions{Max: 5}, p("f")); code != 0 || stdout != "hello" {
		t.Errorf("read: %d %q", code, stdout)
	}
	if code, stdout, _ := fsRun(t, "", agentproto.FSRead, agentproto.FSOptions{}, p("l")); code != 0 || stdout != "hello" {
		t.Errorf("read through a link: %d %q", code, stdout)
	}
	// A file that does not say its size (procfs) is read to its bound.
	if code, stdout, _ := fsRun(t, "", agentproto.FSRead, agentproto.FSOptions{Max: 3}, "/proc/self/status"); code != agentproto.FSExitTooBig || len(stdout) > 3 {
		t.Errorf("read of procfs past its bound: %d, %d bytes", code, len(stdout))
	}
	// A new file gets its mode exactly; an old one keeps its mode.
	if code, _, stderr := fsRun(t, "data", agentproto.FSWrite, agentproto.FSOptions{Mode: 0o600, Max: 4}, p("new")); code != 0 {
		t.Fatalf("write: %d %s", code, stderr)
	}
	if fi, err := os.Stat(p("new")); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 4 {
		t.Errorf("the new file: %v, %v", fi, err)
	}
	if code, _, _ := fsRun(t, "bye", agentproto.FSWrite, agentproto.FSOptions{Mode: 0o777}, p("f")); code != 0 {
		t.Fatal(code)
	}
	if b, _ := os.ReadFile(p("f")); string(b) != "bye" {
		t.Errorf("the rewritten file: %q", b)
	}
	if fi, _ := os.Stat(p("f")); fi.Mode().Perm() != 0o640 {
		t.Errorf("the rewritten file's mode: %v", fi.Mode())
	}
	if code, _, _ := fsRun(t, "", agentproto.FSWrite, agentproto.FSOptions{Mode: 0o2755}, p("sgid")); code != 0 {
		t.Fatal(code)
	}
	if fi, _ := os.Stat(p("sgid")); fi.Mode()&os.ModeSetgid == 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("a set-gid file: %v", fi.Mode())
	}
	// Past --max: a new file is not left, an old one is left empty.
	if code, _, _ := fsRun(t, "12345", agentproto.FSWrite, agentproto.FSOptions{Max: 4}, p("big")); code != agentproto.FSExitTooBig {
		t.Errorf("write past its bound: %d", code)
	}
	if _, err := os.Lstat(p("big")); err == nil {
		t.Error("a new file past its bound was left")
	}
	if code, _, _ := fsRun(t, "12345", agentproto.FSWrite, agentproto.FSOptions{Max: 4}, p("f")); code != agentproto.FSExitTooBig {
		t.Errorf("write past its bound: %d", code)
	}
	if b, err := os.ReadFile(p("f")); err != nil || len(b) != 0 {
		t.Errorf("an old file past its bound: %q, %v", b, err)
	}
	// Exactly at the bound is fine.
	if code, _, _ := fsRun(t, "1234", agentproto.FSWrite, agentproto.FSOptions{Max: 4}, p("f")); code != 0 {
		t.Errorf("write of exactly its bound: %d", code)
	}
}

// TestFSAsUser: the fs subcommand run through the agent as an
// unprivileged account, as the host runs it: the guest's permissions
// decide (permission denied, exit 5), and what it makes is the user's.
func TestFSAsUser(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent binary")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and a nobody account")
	}
	t.Parallel()
	bin := testutil.ForOthers(t, testutil.BuildStatic(t, "github.com/vmgate/vmgate/cmd/vmgate-agent", ""))
	dir := testutil.ForOthers(t, t.TempDir())
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(dir, "mine")
	if err := os.Mkdir(mine, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(mine, 0o777); err != nil {
		t.Fatal(err)
	}
	c := client(t)
	fsAs := func(stdin string, op string, o agentproto.FSOptions, paths ...string) result {
		argv := agentproto.FSArgv(op, o, paths...)
		argv[0] = bin
		return run(t, c, agentproto.ExecSpec{Argv: argv, User: "nobody", Dir: dir}, []byte(stdin))
	}
	if res := fsAs("", agentproto.FSMkdir, agentproto.FSOptions{}, "root-owned"); res.status != agentproto.FSExitDenied ||
		!strings.Contains(res.stderr, "permission denied") {
		t.Errorf("mkdir in root's directory: %+v", res)
	}
	if res := fsAs("x", agentproto.FSWrite, agentproto.FSOptions{}, "/etc/vmgate-fs-test"); res.status != agentproto.FSExitDenied {
		t.Errorf("write to /etc: %+v", res)
	}
	if res := fsAs("hi", agentproto.FSWrite, agentproto.FSOptions{Max: 10}, "mine/note"); res.status != 0 {
		t.Fatalf("write in a directory nobody may write: %+v", res)
	}
	res := fsAs("", agentproto.FSStat, agentproto.FSOptions{}, "mine/note")
	var e agentproto.FileEntry
	if res.status != 0 || json.Unmarshal([]byte(res.stdout), &e) != nil || strconv.FormatUint(uint64(e.UID), 10) != nobody.Uid || e.Owner != "nobody" || e.Mode != 0o644 {
		t.Errorf("stat of nobody's file: %+v (%+v)", res, e)
	}
}
