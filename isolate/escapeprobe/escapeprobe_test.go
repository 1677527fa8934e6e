//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testutil"

	"github.com/vmgate/vmgate/isolate/escapeprobe/attempts"
)

const nobody = 65534

func TestImplsMatchTable(t *testing.T) {
	for _, name := range attempts.Names() {
		if impls[name] == nil {
			t.Errorf("attempt %q has no implementation", name)
		}
	}
	for name := range impls {
		if _, ok := attempts.Lookup(name); !ok {
			t.Errorf("implementation %q is not in the attempts table", name)
		}
	}
}

func TestParseFlags(t *testing.T) {
	c, list, err := parseFlags([]string{
		"--out", "/x.json", "--host-file", "/a", "--host-file", "/b", "--host-dir", "/h",
		"--other-vm-dir", "/o", "--host-socket", "/s", "--host-pid", "42",
		"--writable-dir", "/vm", "--no-kvm", "--only", "iopl", "--skip", "reboot",
	}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if list || c.out != "/x.json" || strings.Join(c.hostFiles, ",") != "/a,/b" || c.hostDir != "/h" ||
		c.otherVMDir != "/o" || c.hostSocket != "/s" || c.hostPID != 42 || c.writableDir != "/vm" ||
		!c.noKVM || !c.only["iopl"] || !c.skip["reboot"] {
		t.Errorf("parsed %+v, list=%v", c, list)
	}
	for _, bad := range [][]string{
		{"--only", "no-such-attempt"},
		{"--skip", "no-such-attempt"},
		{"--host-pid", "-3"},
		{"stray"},
		{"--bogus"},
	} {
		if _, _, err := parseFlags(bad, io.Discard); err == nil {
			t.Errorf("parseFlags(%q) succeeded", bad)
		}
	}
	if _, list, err := parseFlags([]string{"--list"}, io.Discard); err != nil || !list {
		t.Errorf("--list: list=%v err=%v", list, err)
	}
}

// TestRunSelection runs two harmless attempts in-process: the positive
// controls, which only write into a temp dir and read /dev/urandom.
func TestRunSelection(t *testing.T) {
	dir := t.TempDir()
	c := &config{writableDir: dir, only: map[string]bool{"write-own-vm-dir": true, "read-dev-urandom": true}, skip: map[string]bool{}}
	calls := 0
	rep, err := run(c, func(partial attempts.Report) error {
		calls++
		if len(partial.Results) != calls {
			t.Errorf("progress call %d saw %d results", calls, len(partial.Results))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 || len(rep.Results) != 2 {
		t.Fatalf("calls=%d results=%+v", calls, rep.Results)
	}
	for _, r := range rep.Results {
		if r.Blocked || !r.Control {
			t.Errorf("control %+v", r)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Errorf("left behind %v", ents)
	}

	// A progress error ends the run.
	_, err = run(c, func(attempts.Report) error { return errors.New("disk full") })
	if err == nil {
		t.Error("progress error ignored")
	}
}

func TestRunOneRecoversPanic(t *testing.T) {
	o := runOne(func(*config) outcome { panic("boom") }, &config{})
	if o.blocked || !strings.Contains(o.detail, "boom") {
		t.Errorf("panic outcome %+v; a probe bug must never read as blocked", o)
	}
}

// buildProbe builds the probe statically into dir.
func buildProbe(t *testing.T, dir string) string {
	t.Helper()
	return testutil.BuildStatic(t, "github.com/vmgate/vmgate/isolate/escapeprobe", dir)
}

// mkdir makes dir with mode (exactly, despite the umask) and owner.
func mkdir(t *testing.T, dir string, mode os.FileMode, uid int) string {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sleeperPIDs lists live processes whose executable is bin.
func sleeperPIDs(bin string) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink("/proc/" + e.Name() + "/exe")
		if err == nil && strings.TrimSuffix(exe, " (deleted)") == bin {
			out = append(out, pid)
		}
	}
	return out
}

// leftovers lists files named vmgate-escapeprobe-* in dir (with the given
// more specific prefix, if any).
func leftovers(dir, prefix string) []string {
	var out []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), uniquePrefix) && strings.HasPrefix(e.Name(), prefix) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// TestProbeUnjailedAsNobody builds the probe and runs it outside any jail
// as uid 65534. Even there, every attempt that needs privilege must be
// blocked, the positive control must pass, and nothing may be left behind.
func TestProbeUnjailedAsNobody(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the probe as uid 65534")
	}
	if testing.Short() {
		t.Skip("builds the probe and starts up to 2000 processes")
	}
	base, err := os.MkdirTemp("", "escapeprobe-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := buildProbe(t, mkdir(t, filepath.Join(base, "bin"), 0o755, 0))

	// Host things the probe must not reach: a 0600 root file in a
	// traversable dir, a 0700 root dir holding a socket, another VM's 0700
	// dir holding a disk, and this (root) test process.
	pub := mkdir(t, filepath.Join(base, "pub"), 0o755, 0)
	hostFile := filepath.Join(pub, "secret")
	if err := os.WriteFile(hostFile, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hostDir := mkdir(t, filepath.Join(base, "host"), 0o700, 0)
	hostSocket := filepath.Join(hostDir, "daemon.sock")
	ln, err := net.Listen("unix", hostSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	otherVM := mkdir(t, filepath.Join(base, "other-vm"), 0o700, 0)
	if err := os.WriteFile(filepath.Join(otherVM, "disk.qcow2"), []byte("disk"), 0o600); err != nil {
		t.Fatal(err)
	}
	writable := mkdir(t, filepath.Join(base, "vm"), 0o700, nobody)
	outDir := mkdir(t, filepath.Join(base, "out"), 0o700, nobody)
	outFile := filepath.Join(outDir, "report.json")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin,
		"--out", outFile,
		"--host-file", hostFile,
		"--host-dir", hostDir,
		"--other-vm-dir", otherVM,
		"--host-socket", hostSocket,
		"--host-pid", strconv.Itoa(os.Getpid()),
		"--writable-dir", writable,
		"--no-kvm",
	)
	cmd.Dir = writable
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent"}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
			t.Skipf("cannot become uid %d here: %v", nobody, err)
		}
		t.Fatal(err)
	}
	probePID := cmd.Process.Pid
	runErr := cmd.Wait()
	t.Logf("probe stderr:\n%s", stderr.String())
	if runErr != nil {
		t.Fatalf("probe: %v", runErr)
	}
	if stdout.Len() != 0 {
		t.Errorf("with --out, stdout should be empty, got %q", stdout.String())
	}

	f, err := os.Open(outFile)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := attempts.Decode(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}

	// Every attempt ran, once, under its table name.
	names := map[string]bool{}
	for _, r := range rep.Results {
		if names[r.Name] {
			t.Errorf("duplicate result %q", r.Name)
		}
		names[r.Name] = true
		if r.Detail == "" {
			t.Errorf("%s: empty detail", r.Name)
		}
		if r.Skipped {
			t.Errorf("%s: skipped although every flag was given: %s", r.Name, r.Detail)
		}
	}
	if len(names) < 30 {
		t.Errorf("only %d distinct attempts reported", len(names))
	}
	for _, n := range attempts.Names() {
		if !names[n] {
			t.Errorf("attempt %q missing from the report", n)
		}
	}

	ctl, ok := rep.Get("write-own-vm-dir")
	if !ok || !ctl.Control || ctl.Blocked {
		t.Errorf("positive control write-own-vm-dir: %+v", ctl)
	}

	// What an unprivileged user outside any jail still cannot do.
	mustBlock := []string{
		"read-etc-shadow", "read-host-files", "list-host-dir", "write-host-dir",
		"list-other-vm-dir", "write-other-vm-dir", "proc-host-root",
		"kill-host-pid", "ptrace-host-pid", "ptrace-pid-1", "ptrace-parent",
		"mount-tmpfs", "umount-root", "unshare-mount", "setns-host-mnt", "setns-host-net",
		"chroot-dotdot", "chroot-escape", "pivot-root", "connect-host-socket",
		"mknod-char-device", "write-etc", "write-root", "rlimit-nofile-raise",
		"setuid-0", "setgid-0", "capset-regain", "capeff-zero",
		"init-module", "finit-module", "reboot", "iopl", "sethostname",
		"write-proc-core-pattern", "write-proc-sysrq-trigger", "read-proc-kcore",
		"open-by-handle-at", "open-dev-mem", "socket-packet",
	}
	for _, n := range mustBlock {
		r, ok := rep.Get(n)
		if !ok {
			continue // reported above
		}
		if !r.Blocked {
			t.Errorf("%s was not blocked for an unprivileged user: %s", n, r.Detail)
		}
	}
	// Honesty: details carry the errno name of the refusal.
	if r, _ := rep.Get("mount-tmpfs"); !strings.Contains(r.Detail, "(EPERM)") {
		t.Errorf("mount-tmpfs detail lacks the errno: %q", r.Detail)
	}

	// The human table went to stderr.
	for _, n := range []string{"write-own-vm-dir", "control-ok", "read-etc-shadow"} {
		if !strings.Contains(stderr.String(), n) {
			t.Errorf("stderr table lacks %q", n)
		}
	}

	// Nothing left behind: no files, no sleepers.
	var left []string
	left = append(left, leftovers(writable, "")...)
	left = append(left, leftovers(os.TempDir(), uniquePrefix+strconv.Itoa(probePID))...)
	left = append(left, leftovers("/tmp", uniquePrefix+strconv.Itoa(probePID))...)
	left = append(left, leftovers("/", uniquePrefix+strconv.Itoa(probePID))...)
	left = append(left, leftovers("/etc", uniquePrefix+strconv.Itoa(probePID))...)
	if len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
	if pids := sleeperPIDs(bin); len(pids) > 0 {
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		t.Errorf("left %d sleeper processes running: %v", len(pids), pids)
	}
}

// TestProbeStdoutAndList checks the stdout report and --list, running only
// the two positive controls as uid 65534.
func TestProbeStdoutAndList(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the probe as uid 65534")
	}
	base, err := os.MkdirTemp("", "escapeprobe-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := buildProbe(t, mkdir(t, filepath.Join(base, "bin"), 0o755, 0))
	writable := mkdir(t, filepath.Join(base, "vm"), 0o700, nobody)
	cred := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody, Groups: []uint32{}}}

	cmd := exec.Command(bin, "--writable-dir", writable, "--only", "write-own-vm-dir", "--only", "read-dev-urandom")
	cmd.Dir = writable
	cmd.SysProcAttr = cred
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("probe: %v\n%s", err, stderr.String())
	}
	rep, err := attempts.Decode(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := strings.Join(rep.Sorted(), ","); got != "read-dev-urandom,write-own-vm-dir" {
		t.Errorf("ran %s", got)
	}
	if f := rep.Failures(); len(f) != 0 {
		t.Errorf("controls failed: %+v", f)
	}

	cmd = exec.Command(bin, "--list")
	cmd.SysProcAttr = cred
	out, err = cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != len(attempts.Names()) {
		t.Errorf("--list printed %d lines, want %d", len(lines), len(attempts.Names()))
	}

	cmd = exec.Command(bin, "--only", "nope")
	cmd.SysProcAttr = cred
	if err := cmd.Run(); err == nil {
		t.Error("--only nope succeeded")
	} else if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("--only nope: %v, want exit status 2", err)
	}
}
