package cli

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

// sessionNetPolicy allows sessions, and gives VMs a NIC (a netstack
// process each) on a rule that allows a name nothing resolves.
var sessionNetPolicy = strings.Replace(servePolicy, "[profile.timeout]",
	"[profile.sessions]\nallowed = true\n[profile.network]\nmode = \"allowlist\"\nallow = [\"nothing.invalid:80\"]\n[profile.timeout]", 1)

// TestServe_KilledMidSave: kill -9 of vmgated in the middle of a pause
// and, after the restart, in the middle of a fork of a running session,
// each caught once its partial save point is on disk. After each restart
// nothing of the killed daemon is left: no partial save point, fork point
// or VM directory, none of its processes (QEMU, the netstacks) alive, no cgroup of its VMs; the session being saved was
// running on record and is reported lost (205, audited, logged); a fork's
// copy that was never handed out does not exist; a session paused before
// both kills resumes with its files. The built vm-exec forks that paused
// session into two (--fork A --fork B), which see none of each other's
// writes.
func TestServe_KilledMidSave(t *testing.T) {
	dir := t.TempDir()
	s := startServeWith(t, dir, sessionNetPolicy)
	run := func(s *served, args ...string) string {
		t.Helper()
		so, se, code := vmExec(t, s.socket, args...)
		if code != 0 {
			t.Fatalf("vm-exec %q: %d %q %q", args, code, so, se)
		}
		return so
	}
	run(s, "--session", "kept", "-c", "echo kept > ~/f")
	run(s, "--session", "kept", "--pause")
	run(s, "--session", "a", "-c", "echo a > ~/f")

	s = killMidSave(t, dir, s, filepath.Join("sessions", "*", "sp-*.partial"), "--session", "a", "--pause")
	wantLost(t, s, "a")
	run(s, "--session", "b", "-c", "echo b > ~/f")
	s = killMidSave(t, dir, s, filepath.Join("forks", "*.partial"), "--session", "b", "--fork", "c")
	wantLost(t, s, "b")
	if so := run(s, "--list-sessions"); !strings.HasPrefix(so, "kept\tpaused=") || strings.Count(so, "\n") != 1 {
		t.Errorf("sessions after the kills: %q, want kept alone, paused", so)
	}
	for _, n := range []string{"a", "b"} {
		var lost []audit.Record
		for _, r := range testutil.JSONLines[audit.Record](t, s.audit) {
			if r.Kind == audit.KindSession && r.Session == n && strings.HasPrefix(r.Message, "lost: vmgated stopped while it was running") {
				lost = append(lost, r)
			}
		}
		if len(lost) != 1 {
			t.Errorf("%d audit records of %s's loss, want 1", len(lost), n)
		}
	}

	// The paused session, forked by the built vm-exec: it stays paused.
	so := run(s, "--session", "kept", "--fork", "k1", "--fork", "k2")
	if lines := strings.Split(strings.TrimSpace(so), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "k1\tvm=") || !strings.HasPrefix(lines[1], "k2\tvm=") {
		t.Fatalf("vm-exec --fork k1 --fork k2: %q", so)
	}
	if so := run(s, "--session", "k1", "-c", "cat ~/f; echo k1 > ~/f"); so != "kept\n" {
		t.Errorf("k1: %q", so)
	}
	if so := run(s, "--session", "k2", "-c", "cat ~/f"); so != "kept\n" {
		t.Errorf("k2 after k1's write: %q", so)
	}
	run(s, "--end-session", "k1")
	run(s, "--end-session", "k2") // the daemon's two VM slots: one for kept
	if so := run(s, "--session", "kept", "-c", "cat ~/f"); so != "kept\n" {
		t.Errorf("the paused session after two kills and a fork: %q", so)
	}
	run(s, "--end-session", "kept")
	if left := readDir(filepath.Join(s.state, "sessions")); len(left) != 0 {
		t.Errorf("sessions' files left: %v", left)
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.exited
}

// killMidSave runs vm-exec with args (a pause or a fork), waits until a
// partial save point matching glob (under the state directory) appears,
// and kills the daemon with SIGKILL while it is there: the daemon is
// stopped first (SIGSTOP), so that it cannot finish the save between the
// look and the kill. It starts the next daemon on the same directory and
// checks that the killed one left nothing: no partial save point or fork
// point, no VM directory, no process, no cgroup of its VMs.
func killMidSave(t *testing.T, dir string, s *served, glob string, args ...string) *served {
	t.Helper()
	op := exec.Command(binary(t, "vm-exec"), append([]string{"--socket", s.socket}, args...)...)
	var opErr testutil.SyncBuffer
	op.Stderr = &opErr
	if err := op.Start(); err != nil {
		t.Fatal(err)
	}
	opDone := make(chan error, 1)
	go func() { opDone <- op.Wait() }()
	partial := func() []string {
		m, _ := filepath.Glob(filepath.Join(s.state, glob))
		return m
	}
	deadline := time.Now().Add(2 * time.Minute)
	for len(partial()) == 0 {
		select {
		case err := <-opDone:
			t.Fatalf("vm-exec %q ended (%v, %q) before its partial save point %s was seen", args, err, opErr.String(), glob)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s after 2 min", glob)
		}
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	if len(partial()) == 0 {
		t.Fatalf("vm-exec %q: the save ended before the daemon stopped", args)
	}
	// What the daemon runs now: its processes, its VMs (the saved one
	// among them) and their cgroups.
	procs := descendants(s.cmd.Process.Pid)
	vms := map[string]string{} // VM directory: its QEMU's /proc/PID/cgroup
	for _, e := range readDir(filepath.Join(s.state, "vms")) {
		vmDir := filepath.Join(s.state, "vms", e.Name())
		if out, err := exec.Command("pgrep", "-f", "qemu-system.*"+vmDir).Output(); err == nil {
			cg, _ := os.ReadFile("/proc/" + strings.Fields(string(out))[0] + "/cgroup")
			vms[vmDir] = string(cg)
		}
	}
	if len(vms) == 0 {
		t.Fatalf("VMs with a QEMU during the save: %v, want the saved one", vms)
	}
	t.Logf("killed mid-save (%s): %d processes, VMs %v", glob, len(procs), slices.Collect(maps.Keys(vms)))
	_ = s.cmd.Process.Kill()
	<-s.exited
	if err := <-opDone; err == nil || op.ProcessState.ExitCode() != wire.ExitUnreachable {
		t.Errorf("vm-exec %q when its daemon was killed: %v %q, want exit %d", args, err, opErr.String(), wire.ExitUnreachable)
	}

	s2 := startServeWith(t, dir, sessionNetPolicy)
	if m := partial(); len(m) != 0 {
		t.Errorf("partial save points left: %v", m)
	}
	if left := readDir(filepath.Join(s2.state, "forks")); len(left) != 0 {
		t.Errorf("fork points left: %v", left)
	}
	for vmDir, cg := range vms {
		if _, err := os.Stat(vmDir); err == nil {
			t.Errorf("%s left by the killed daemon", vmDir)
		}
		if left := testutil.CgroupDirsOf(cg, filepath.Base(vmDir)); len(left) > 0 {
			t.Errorf("cgroups of the killed daemon's VM remain: %v", left)
		}
	}
	for _, p := range procs {
		if p.alive() {
			t.Errorf("process %d (%s) of the killed daemon still runs", p.pid, p.cmd)
		}
	}
	return s2
}

// wantLost checks that the session, running when its daemon was killed,
// is reported lost: its next command does not run and exits 205, and the
// daemon logged the loss.
func wantLost(t *testing.T, s *served, name string) {
	t.Helper()
	if _, se, code := vmExec(t, s.socket, "--session", name, "-c", "cat ~/f"); code != wire.ExitVMFailed || !strings.Contains(se, `session "`+name+`" was lost`) {
		t.Errorf("a session being saved at kill -9: %d %q", code, se)
	}
	found := false
	for _, l := range s.logLines("session lost") {
		found = found || strings.Contains(l, `"session":"`+name+`"`) || strings.Contains(l, "session="+name+" ")
	}
	if !found {
		t.Errorf("the new daemon's log has no loss of %s: %q", name, s.logLines("session lost"))
	}
	if left := readDir(filepath.Join(s.state, "lost")); len(left) != 0 {
		t.Errorf("lost notes left after their owner was told: %v", left)
	}
}
