package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
)

// sessionsPolicy allows sessions, and at most two paused ones per caller.
const sessionsPolicy = `version = 1

[[profile]]
name = "test"
match = { any = true }
user = "root"
max_vms = 4
max_vms_per_caller = 4
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
//     its running processes;
//   - fork makes copies that have the state at the fork and see no one
//     else's writes;
//   - a pause past the caller's budget is refused and the session runs on;
//   - a graceful stop pauses the running sessions, and the next daemon
//     resumes them;
//   - a session whose saved state was damaged is reported lost (205),
//     once, and the next command starts a new one;
//   - ended sessions leave no files.
func TestGateway_Sessions(t *testing.T) {
	state := t.TempDir()
	d := gatewaytest.Start(t, sessionsPolicy, sessionsConfig(t, state))
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	sh := func(d *gatewaytest.Daemon, session, cmd string) (*wire.Result, string, string, error) {
		return d.Exec(t, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: session}, nil)
	}
	must := func(d *gatewaytest.Daemon, session, cmd, want string) {
		t.Helper()
		res, so, se, err := sh(d, session, cmd)
		if err != nil || res.ExitCode != 0 || so != want {
			t.Fatalf("%s: %q: %+v %v %q %q, want %q", session, cmd, res, err, so, se, want)
		}
	}

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
		must(d, "s", "cat /root/f /dev/shm/m; "+counting, "kept\nshm\ncounting\n")
	})

	t.Run("fork", func(t *testing.T) {
		copies, err := d.Client.ForkSession(ctx, "s", []string{"f1", "f2"})
		if err != nil || len(copies) != 2 || copies[0].Parent != "s" {
			t.Fatalf("fork: %+v %v", copies, err)
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
			must(d, c, "cat /root/f /dev/shm/m; test ! -e /root/g && echo clean; "+counting, "kept\nshm\nclean\ncounting\n")
		}
		must(d, "f1", "echo mine > /root/f1", "")
		must(d, "f2", "test ! -e /root/f1 && echo clean", "clean\n")
		must(d, "s", "test ! -e /root/f1 && echo clean", "clean\n")
		if _, err := d.Client.ForkSession(ctx, "s", []string{"f1"}); err == nil || !strings.Contains(err.Error(), "already has a session") {
			t.Errorf("a fork onto an existing session: %v", err)
		}
	})

	t.Run("the paused budget", func(t *testing.T) {
		for _, c := range []string{"f1", "f2"} {
			if _, err := d.Client.PauseSession(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		_, err := d.Client.PauseSession(ctx, "s")
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Body.Rule != "sessions.max_paused" {
			t.Fatalf("a third pause: %v", err)
		}
		must(d, "s", "cat /root/g", "after-fork\n")
	})

	// A graceful stop pauses the running session; the next daemon on the
	// same state directory resumes all three.
	d.StopAndCheck(t)
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
	must(d2, "f2", "cat /root/f", "kept\n")

	t.Run("a damaged save point", func(t *testing.T) {
		states, _ := filepath.Glob(filepath.Join(state, "sessions", "*", "sp-*", vm.TemplateStateFile))
		damaged := 0
		for _, p := range states {
			b, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(p)), "session.json"))
			if bytes.Contains(b, []byte(`"name": "f1"`)) {
				if err := os.WriteFile(p, []byte("not a state"), 0o600); err != nil {
					t.Fatal(err)
				}
				damaged++
			}
		}
		if damaged != 1 {
			t.Fatalf("found %d save points of f1", damaged)
		}
		_, _, _, err := sh(d2, "f1", "true")
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Body.ExitCode() != wire.ExitVMFailed || !strings.Contains(ae.Body.Error, "was lost") {
			t.Fatalf("a damaged session: %v", err)
		}
		must(d2, "f1", "test ! -e /root/f && echo new", "new\n")
	})

	for _, n := range []string{"s", "f1", "f2"} {
		if err := d2.Client.EndSession(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "sessions")); len(ents) != 0 {
		t.Errorf("ended sessions left files: %v", ents)
	}
}
