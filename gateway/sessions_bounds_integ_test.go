package gateway_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
)

// pauseAfterPolicy pauses a session that runs no command for a second.
const pauseAfterPolicy = `version = 1

[[profile]]
name = "test"
match = { any = true }
user = "root"
max_vms = 4
allow_shell = true
[profile.timeout]
default = "60s"
max = "5m"
[profile.sessions]
allowed = true
pause_after = "1s"
idle_timeout = "10m"
max_lifetime = "30m"
`

// shortLifePolicy ends sessions 6 s after they began, paused or not.
var shortLifePolicy = strings.NewReplacer(`pause_after = "1s"`+"\n", "", `idle_timeout = "10m"`, `idle_timeout = "6s"`,
	`max_lifetime = "30m"`, `max_lifetime = "6s"`).Replace(pauseAfterPolicy)

// TestGateway_SessionsPauseAfterAndLifetime holds the bounds of time on
// sessions:
//   - with sessions.pause_after, a session that runs no command for that
//     long is paused (its VM freed, audited "paused: idle"), and its next
//     command resumes it with its files;
//   - max_lifetime ends a paused session for good: its save point's
//     files are removed and its end is audited as expired.
func TestGateway_SessionsPauseAfterAndLifetime(t *testing.T) {
	state := t.TempDir()
	d := gatewaytest.Start(t, pauseAfterPolicy, sessionsConfig(t, state))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	must := func(session, cmd, want string) {
		t.Helper()
		res, so, se, err := d.Exec(t, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: session}, nil)
		if err != nil || res.ExitCode != 0 || so != want {
			t.Fatalf("%s: %q: %+v %v %q %q, want %q", session, cmd, res, err, so, se, want)
		}
	}
	// stateOf is a session's state once no operation owns it: a pause
	// under way shows it paused before its VM is closed.
	stateOf := func(name string) string {
		ss, err := d.Client.Sessions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range ss {
			switch {
			case s.Name != name:
			case s.Busy:
				return "busy"
			default:
				return s.State
			}
		}
		return "gone"
	}

	t.Run("pause_after", func(t *testing.T) {
		must("idle", "echo kept > /root/f", "")
		waitFor(t, 2*time.Minute, "the idle session's automatic pause", func() bool { return stateOf("idle") == wire.SessionPaused })
		if st, err := d.Client.Status(ctx); err != nil || st.LiveVMs != 0 {
			t.Errorf("a session paused for idleness holds a VM: %+v %v", st, err)
		}
		if r := sessionRecords(t, d.AuditPath, "idle", "paused: idle"); len(r) != 1 || r[0].Snapshot == "" {
			t.Errorf("the automatic pause's records: %+v", r)
		}
		must("idle", "cat /root/f", "kept\n")
		if r := sessionRecords(t, d.AuditPath, "idle", "resumed"); len(r) != 1 {
			t.Errorf("the resume's records: %+v", r)
		}
	})

	t.Run("max_lifetime of a paused session", func(t *testing.T) {
		setPolicy(t, d, shortLifePolicy)
		must("short", "echo x > /root/f", "")
		dir := sessionDirOf(t, state, "short")
		ss, err := d.Client.PauseSession(ctx, "short")
		if err != nil || ss.State != wire.SessionPaused {
			t.Fatalf("pause: %+v %v", ss, err)
		}
		if sps, _ := filepath.Glob(filepath.Join(dir, "sp-*")); len(sps) != 1 {
			t.Fatalf("save points of the paused session: %v", sps)
		}
		waitFor(t, time.Minute, "the paused session's end at its lifetime", func() bool {
			_, err := os.Stat(dir)
			return errors.Is(err, os.ErrNotExist)
		})
		if s := stateOf("short"); s != "gone" {
			t.Errorf("a session past its lifetime is %s", s)
		}
		recs := sessionRecords(t, d.AuditPath, "short", "")
		if n := len(recs); n < 3 || !strings.HasPrefix(recs[n-2].Message, "paused: ") || recs[n-1].Message != "ended: expired" {
			t.Errorf("the short session's records, want it paused and then expired: %+v", recs)
		}
	})

	// The idle session is paused again once idle; its end removes it.
	waitFor(t, 2*time.Minute, "the idle session's second pause", func() bool { return stateOf("idle") == wire.SessionPaused })
	if err := d.Client.EndSession(ctx, "idle"); err != nil {
		t.Fatal(err)
	}
	if ents := readDirNames(filepath.Join(state, "sessions")); len(ents) != 0 {
		t.Errorf("ended sessions left files: %v", ents)
	}
}
