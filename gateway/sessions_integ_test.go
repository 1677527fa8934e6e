package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
)

// sessionsPolicy allows sessions, three VMs and two paused sessions per
// caller.
const sessionsPolicy = `version = 1

[[profile]]
name = "test"
match = { any = true }
user = "root"
max_vms = 4
max_vms_per_caller = 3
allow_shell = true
[profile.timeout]
default = "60s"
max = "5m"
[profile.sessions]
allowed = true
idle_timeout = "10m"
max_lifetime = "30m"
max_paused = 2
`

// cancelAfterFirst cancels its context at the first bytes written: a
// client that dies once output starts (a pipeline whose head exited).
type cancelAfterFirst struct{ cancel context.CancelFunc }

func (c cancelAfterFirst) Write(p []byte) (int, error) { c.cancel(); return len(p), nil }

// sessionsConfig runs the daemon with templates (its sessions are
// restored clones, as in production) in state, which outlives it.
func sessionsConfig(t *testing.T, state string) func(*gateway.Config) {
	tdir := testutil.TemplateDir(t)
	return func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir, c.VM.StateDir = false, 0, tdir, state
		c.AuditPath = filepath.Join(state, "audit.jsonl")
		c.MaxVMs, c.Grace = 4, 30*time.Second
	}
}

// TestGateway_Sessions covers sessions that last and branch, on one
// daemon and its successor:
//   - a caller's next command never fails because its own previous
//     command's client went away (100 times in a row);
//   - pause frees the VM, the next command resumes it with its files and
//     its running processes; its files are the daemon's, 0600 (0400) in
//     0700 directories; two commands at once on the paused session resume
//     it once, into one VM;
//   - fork waits for the command running in the session and copies the
//     state that command left; copies see no one else's writes;
//   - a fork past the caller's VM limit is refused before anything is
//     copied, and the parent runs on untouched;
//   - a pause past the caller's budget (sessions.max_paused,
//     sessions.max_paused_mib) is refused with the rule, and the session
//     runs on;
//   - another uid can neither pause nor fork the caller's sessions;
//   - the metrics count the pauses, resumes, forks and paused bytes;
//   - a graceful stop pauses the running sessions, and the next daemon
//     resumes them;
//   - a session whose saved state was damaged, or was saved from another
//     image (an upgrade), is not resumed: the command exits 205 naming
//     why, the session is lost, and the next command starts a new one;
//   - every pause, resume, fork and loss is in the audit log, with the
//     snapshot's digest, the parent, the children and the reason;
//   - ended sessions leave no files.
func TestGateway_Sessions(t *testing.T) {
	state := t.TempDir()
	d := gatewaytest.Start(t, sessionsPolicy, sessionsConfig(t, state))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sh := func(d *gatewaytest.Daemon, session, cmd string) (*wire.Result, string, string, error) {
		return d.Exec(t, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: session}, nil)
	}
	must := func(d *gatewaytest.Daemon, session, cmd, want string) *wire.Result {
		t.Helper()
		res, so, se, err := sh(d, session, cmd)
		if err != nil || res.ExitCode != 0 || so != want {
			t.Fatalf("%s: %q: %+v %v %q %q, want %q", session, cmd, res, err, so, se, want)
		}
		return res
	}
	var ae *client.APIError

	t.Run("a dead client's command does not hold the session", func(t *testing.T) {
		must(d, "s", "true", "")
		for i := range 100 {
			cctx, ccancel := context.WithCancel(ctx)
			_, _ = d.Client.Exec(cctx, wire.ExecRequest{Argv: []string{"seq", "1", "20000"}, Session: "s"}, client.ExecIO{Stdout: cancelAfterFirst{ccancel}})
			ccancel()
			res, _, se, err := sh(d, "s", "true")
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("round %d: the next command: %+v %v %q", i, res, err, se)
			}
		}
	})

	// State on disk and in memory, and a process that keeps counting.
	must(d, "s", "echo kept > /root/f; echo shm > /dev/shm/m; setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/n; sleep 0.2; done' </dev/null >/dev/null 2>&1 &", "")
	counting := "a=$(cat /dev/shm/n); sleep 1; b=$(cat /dev/shm/n); test $b -gt $a && echo counting"

	t.Run("pause and resume", func(t *testing.T) {
		ss, err := d.Client.PauseSession(ctx, "s")
		if err != nil || ss.State != wire.SessionPaused || ss.VMID != "" || ss.DiskBytes == 0 {
			t.Fatalf("pause: %+v %v", ss, err)
		}
		st, err := d.Client.Status(ctx)
		if err != nil || st.LiveVMs != 0 || len(st.Sessions) != 1 || st.Sessions[0].State != wire.SessionPaused {
			t.Fatalf("a paused session holds a VM, or is not shown paused: %+v %v", st, err)
		}
		if n := checkPrivate(t, filepath.Join(state, "sessions")); n < 7 {
			t.Errorf("a paused session's directory holds %d entries, want its record and a whole save point", n)
		}
		// Two commands at once: one resumes the session, the other waits
		// for it and runs in the same VM.
		type out struct {
			res    *wire.Result
			so, se string
			err    error
		}
		outs := make(chan out, 2)
		for range 2 {
			go func() {
				res, so, se, err := sh(d, "s", "cat /root/f /dev/shm/m; "+counting)
				outs <- out{res, so, se, err}
			}()
		}
		var vms []string
		for range 2 {
			o := <-outs
			if o.err != nil || o.res.ExitCode != 0 || o.so != "kept\nshm\ncounting\n" {
				t.Fatalf("a command on the paused session: %+v %v %q %q", o.res, o.err, o.so, o.se)
			}
			vms = append(vms, o.res.VMID)
		}
		if vms[0] != vms[1] || vms[0] == "" {
			t.Errorf("two commands at once on a paused session ran in VMs %q", vms)
		}
		if n := len(sessionRecords(t, d.AuditPath, "s", "resumed")); n != 1 {
			t.Errorf("two commands at once resumed the session %d times", n)
		}
		if st, err := d.Client.Status(ctx); err != nil || st.LiveVMs != 1 {
			t.Errorf("after two commands on one paused session: %+v %v, want one VM", st, err)
		}
	})

	t.Run("fork waits for the running command", func(t *testing.T) {
		started := &firstWrite{ch: make(chan struct{})}
		done := make(chan error, 1)
		go func() {
			res, err := d.Client.Exec(ctx, wire.ExecRequest{Argv: []string{"echo started; sleep 1; echo done > /root/c"}, Shell: true, Session: "s"},
				client.ExecIO{Stdout: started})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d", res.ExitCode)
			}
			done <- err
		}()
		select {
		case <-started.ch:
		case err := <-done:
			t.Fatalf("the command to fork during: %v", err)
		}
		t0 := time.Now()
		copies, err := d.Client.ForkSession(ctx, "s", []string{"f1", "f2"})
		if err != nil || len(copies) != 2 || copies[0].Parent != "s" {
			t.Fatalf("fork: %+v %v", copies, err)
		}
		t.Logf("forked in %v, the command's wait included", time.Since(t0))
		if err := <-done; err != nil {
			t.Fatalf("the command the fork waited for: %v", err)
		}
		// The fork point: its directory, disk, state and metadata; its RAM
		// is in memory.
		if n := checkPrivate(t, filepath.Join(state, "forks")); n < 5 {
			t.Errorf("the fork point holds %d entries, want a whole save point", n)
		}
		if m, _ := filepath.Glob(filepath.Join(state, "forks", "*", vm.RAMFile)); len(m) != 0 {
			t.Errorf("a fork point's RAM on disk: %v", m)
		}
		// A copy's state is as old as its parent's: its max_lifetime
		// counts from the parent's start.
		all, err := d.Client.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range all {
			if p.Name == "s" && !copies[0].Created.Equal(p.Created) {
				t.Errorf("a copy created %v, its parent %v: a fork would outlive max_lifetime", copies[0].Created, p.Created)
			}
		}
		must(d, "s", "echo after-fork > /root/g", "")
		for _, c := range []string{"f1", "f2"} {
			must(d, c, "cat /root/f /dev/shm/m /root/c; test ! -e /root/g && echo clean; "+counting, "kept\nshm\ndone\nclean\ncounting\n")
		}
		must(d, "f1", "echo mine > /root/f1", "")
		must(d, "f2", "test ! -e /root/f1 && echo clean", "clean\n")
		must(d, "s", "test ! -e /root/f1 && echo clean", "clean\n")
		if _, err := d.Client.ForkSession(ctx, "s", []string{"f1"}); err == nil || !strings.Contains(err.Error(), "already has a session") {
			t.Errorf("a fork onto an existing session: %v", err)
		}
	})

	t.Run("a fork past the caller's VM limit", func(t *testing.T) {
		// s, f1 and f2 hold the three VMs of max_vms_per_caller.
		before, err := d.Client.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		points := len(readDirNames(filepath.Join(state, "forks")))
		_, err = d.Client.ForkSession(ctx, "s", []string{"g1"})
		if !errors.As(err, &ae) || ae.Body.ExitCode() != wire.ExitBusy || !strings.Contains(ae.Body.Error, "max_vms_per_caller 3") || !strings.Contains(ae.Body.Error, "nothing was copied") {
			t.Fatalf("a fork past the caller's VMs: %v", err)
		}
		after, err := d.Client.Sessions(ctx)
		if err != nil || len(after) != len(before) {
			t.Fatalf("sessions after a refused fork: %+v %v", after, err)
		}
		for i := range after {
			if after[i].Name != before[i].Name || after[i].VMID != before[i].VMID || after[i].State != wire.SessionRunning {
				t.Errorf("a refused fork changed %+v into %+v", before[i], after[i])
			}
		}
		if n := len(readDirNames(filepath.Join(state, "forks"))); n != points {
			t.Errorf("a refused fork left %d fork points, %d before", n, points)
		}
		if r := sessionRecords(t, d.AuditPath, "g1", ""); len(r) != 0 {
			t.Errorf("a refused fork made records of its copy: %+v", r)
		}
		must(d, "s", counting, "counting\n")
	})

	t.Run("the paused budget", func(t *testing.T) {
		for _, c := range []string{"f1", "f2"} {
			if _, err := d.Client.PauseSession(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		_, err := d.Client.PauseSession(ctx, "s")
		if !errors.As(err, &ae) || ae.Body.Rule != "sessions.max_paused" || !strings.Contains(ae.Body.Error, "the session keeps running") {
			t.Fatalf("a third pause: %v", err)
		}
		// A disk budget below the session's memory alone.
		setPolicy(t, d, strings.Replace(sessionsPolicy, "max_paused = 2", "max_paused = 4\nmax_paused_mib = 256", 1))
		_, err = d.Client.PauseSession(ctx, "s")
		if !errors.As(err, &ae) || ae.Body.Rule != "sessions.max_paused_mib" || !strings.Contains(ae.Body.Error, "the session keeps running") {
			t.Fatalf("a pause past max_paused_mib: %v", err)
		}
		setPolicy(t, d, sessionsPolicy)
		must(d, "s", "cat /root/g; "+counting, "after-fork\ncounting\n")
	})

	t.Run("another caller's sessions", func(t *testing.T) {
		before, err := d.Client.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"--session", "s", "--pause"}, {"--session", "s", "--fork", "x"}, {"--session", "f1", "--fork", "y"}} {
			if out, code := asNobody(t, d.Socket, args...); code != wire.ExitInternal || out != "" {
				t.Errorf("uid 65534: vm-exec %q: exit %d %q, want %d: no such session of this caller", args, code, out, wire.ExitInternal)
			}
		}
		if out, code := asNobody(t, d.Socket, "--list-sessions"); code != 0 || out != "" {
			t.Errorf("uid 65534's sessions: %d %q", code, out)
		}
		after, err := d.Client.Sessions(ctx)
		if err != nil || len(after) != len(before) {
			t.Fatalf("sessions after another uid's pause and forks: %+v %v", after, err)
		}
		for i := range after {
			if after[i].Name != before[i].Name || after[i].VMID != before[i].VMID || after[i].State != before[i].State {
				t.Errorf("another uid changed %+v into %+v", before[i], after[i])
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		all, err := d.Client.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var paused int64
		for _, s := range all {
			paused += s.DiskBytes
		}
		m, err := d.Client.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for name, want := range map[string]float64{"vmgate_sessions_paused": 2, "vmgate_sessions_paused_bytes": float64(paused),
			"vmgate_session_forks_total": 2, "vmgate_session_pause_seconds_count": 3, "vmgate_session_resume_seconds_count": 1, "vmgate_sessions_lost_total": 0} {
			if got := metricValue(t, m, name); got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
		if metricValue(t, m, "vmgate_session_resume_seconds_sum") <= 0 || metricValue(t, m, "vmgate_session_pause_seconds_sum") <= 0 {
			t.Errorf("pause and resume took no time:\n%s", m)
		}
	})

	// A graceful stop pauses the running session. Then an upgrade that
	// rebuilt the image, as the next daemon sees it: f2's save point says
	// it was saved from another image.
	d.StopAndCheck(t)
	restamp(t, state, "f2", "image_digest", strings.Repeat("0", 64))
	d2 := gatewaytest.Start(t, sessionsPolicy, sessionsConfig(t, state))
	ss, err := d2.Client.Sessions(ctx)
	if err != nil || len(ss) != 3 {
		t.Fatalf("sessions after a restart: %+v %v", ss, err)
	}
	for _, s := range ss {
		if s.State != wire.SessionPaused {
			t.Errorf("after a restart: %+v", s)
		}
	}
	must(d2, "s", "cat /root/g; "+counting, "after-fork\ncounting\n")

	t.Run("a save point of another image", func(t *testing.T) {
		dir := sessionDirOf(t, state, "f2")
		_, _, _, err := sh(d2, "f2", "true")
		if !errors.As(err, &ae) || ae.Body.ExitCode() != wire.ExitVMFailed || !strings.Contains(ae.Body.Error, `session "f2" was lost`) ||
			!strings.Contains(ae.Body.Error, "image was 000000000000, is ") {
			t.Fatalf("a session saved from another image: %v", err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a lost session's files remain: %v", err)
		}
		if st, err := d2.Client.Status(ctx); err != nil || st.LiveVMs != 1 {
			t.Errorf("after a refused resume: %+v %v, want s's VM alone", st, err)
		}
	})

	t.Run("a damaged save point", func(t *testing.T) {
		states, _ := filepath.Glob(filepath.Join(sessionDirOf(t, state, "f1"), "sp-*", vm.TemplateStateFile))
		if len(states) != 1 {
			t.Fatalf("found %d save points of f1", len(states))
		}
		if err := os.WriteFile(states[0], []byte("not a state"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, _, _, err := sh(d2, "f1", "true")
		if !errors.As(err, &ae) || ae.Body.ExitCode() != wire.ExitVMFailed || !strings.Contains(ae.Body.Error, "was lost") {
			t.Fatalf("a damaged session: %v", err)
		}
		must(d2, "f1", "test ! -e /root/f && echo new", "new\n")
		m, err := d2.Client.Metrics(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := metricValue(t, m, "vmgate_sessions_lost_total"); n != 2 {
			t.Errorf("vmgate_sessions_lost_total = %v, want 2 (f2, f1)", n)
		}
	})

	for _, n := range []string{"s", "f1"} {
		if err := d2.Client.EndSession(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "sessions")); len(ents) != 0 {
		t.Errorf("ended sessions left files: %v", ents)
	}
	t.Run("audit", func(t *testing.T) { checkSessionAudit(t, d2.AuditPath) })
}

// checkSessionAudit checks the session records TestGateway_Sessions left:
// each pause, resume, fork and loss, with the snapshot's digest, the
// parent, the children and the reason.
func checkSessionAudit(t *testing.T, path string) {
	if _, err := audit.VerifyFile(path); err != nil {
		t.Fatal(err)
	}
	one := func(session, prefix string) audit.Record {
		t.Helper()
		r := sessionRecords(t, path, session, prefix)
		if len(r) != 1 {
			t.Fatalf("%d records of %s %q, want 1: %+v", len(r), session, prefix, r)
		}
		return r[0]
	}
	isDigest := regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString
	asked := one("s", "paused: asked by its owner")
	if !isDigest(asked.Snapshot) || asked.SnapshotBytes <= 0 || asked.DurationMS <= 0 {
		t.Errorf("a pause's record: %+v", asked)
	}
	stopped := one("s", "paused: vmgated stopped")
	resumed := sessionRecords(t, path, "s", "resumed")
	if len(resumed) != 2 || resumed[0].Snapshot != asked.Snapshot || resumed[1].Snapshot != stopped.Snapshot || stopped.Snapshot == asked.Snapshot {
		t.Errorf("the resumes' records (want the snapshots of the pause, then of the stop): %+v; pauses %+v %+v", resumed, asked, stopped)
	}
	forked := one("s", "forked")
	if !slices.Equal(forked.Children, []string{"f1", "f2"}) || !isDigest(forked.Snapshot) || forked.RequestID == "" {
		t.Errorf("the fork's record: %+v", forked)
	}
	for _, c := range []string{"f1", "f2"} {
		if r := one(c, "created: a fork of s"); r.Parent != "s" || r.Snapshot != forked.Snapshot {
			t.Errorf("%s's record of its making: %+v, want parent s and snapshot %s", c, r, forked.Snapshot)
		}
	}
	if r := one("f1", "ended: lost: cannot resume it: "); !strings.Contains(r.Message, vm.ErrSavePointDamaged.Error()) {
		t.Errorf("the damaged session's end: %+v", r)
	}
	if r := one("f2", "ended: lost: cannot resume it: "); !strings.Contains(r.Message, vm.ErrSavePointStale.Error()) || !strings.Contains(r.Message, "image was") {
		t.Errorf("the end of the session of another image: %+v", r)
	}
}
