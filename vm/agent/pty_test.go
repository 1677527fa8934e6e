package agent

import (
	"errors"
	"github.com/vmgate/vmgate/internal/sshmsg"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/agentproto"
)

func ptySession(t *testing.T, c *ssh.Client, rows, cols int) *ssh.Session {
	t.Helper()
	s, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.RequestPty("xterm-256color", rows, cols, ssh.TerminalModes{ssh.ECHO: 0}); err != nil {
		t.Fatalf("request pty: %v", err)
	}
	return s
}

func TestPtyExec(t *testing.T) {
	t.Parallel()
	c := client(t)
	s := ptySession(t, c, 33, 111)
	out, err := s.Output("tty; echo $TERM; stty size; test -t 0 && test -t 1 && test -t 2 && echo terminal")
	if err != nil {
		t.Fatalf("run: %v (output %q)", err, out)
	}
	lines := strings.Split(strings.TrimRight(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("output %q", out)
	}
	if !regexp.MustCompile(`^/dev/pts/[0-9]+$`).MatchString(lines[0]) {
		t.Errorf("tty = %q, want /dev/pts/N", lines[0])
	}
	if lines[1] != "xterm-256color" {
		t.Errorf("TERM = %q", lines[1])
	}
	if lines[2] != "33 111" {
		t.Errorf("stty size = %q, want 33 111", lines[2])
	}
	if lines[3] != "terminal" {
		t.Errorf("stdin/stdout/stderr are not terminals: %q", lines[3])
	}
}

func TestPtyExecSpecExitStatus(t *testing.T) {
	t.Parallel()
	c := client(t)
	r := openSession(t, c)
	if !r.request(t, "pty-req", sshmsg.PtyRequest{Term: "vt100", Columns: 80, Rows: 24}) {
		t.Fatal("pty-req rejected")
	}
	if r.request(t, "pty-req", sshmsg.PtyRequest{Term: "vt100", Columns: 80, Rows: 24}) {
		t.Error("second pty-req accepted")
	}
	if !r.execSpec(t, argv("sh", "-c", "test -t 0 || exit 9; echo $TERM; exit 7")) {
		t.Fatal("exec rejected")
	}
	if st := r.wait(t); st != 7 {
		t.Fatalf("status %d, stdout %q, want 7", st, r.stdout.String())
	}
	if got := r.stdout.String(); got != "vt100\r\n" {
		t.Errorf("stdout %q", got)
	}
}

func TestPtyWindowChange(t *testing.T) {
	t.Parallel()
	c := client(t)
	s := ptySession(t, c, 24, 80)
	stdin, err := s.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out testutil.SyncBuffer
	s.Stdout = &out
	if err := s.Start("stty -echo; echo ready; read line; stty size"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, &out, "ready")
	// Want a reply so that the resize is done before the input arrives.
	ok, err := s.SendRequest("window-change", true, ssh.Marshal(sshmsg.WindowChangeRequest{Columns: 132, Rows: 50}))
	if err != nil || !ok {
		t.Fatalf("window-change: ok=%v err=%v", ok, err)
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	if err := s.Wait(); err != nil {
		t.Fatalf("wait: %v (output %q)", err, out.String())
	}
	if got := out.String(); !strings.HasSuffix(got, "50 132\r\n") {
		t.Errorf("output %q, want the new size 50 132", got)
	}
}

func TestPtyWithoutPtyRejectsWindowChange(t *testing.T) {
	t.Parallel()
	c := client(t)
	r := openSession(t, c)
	if r.request(t, "window-change", sshmsg.WindowChangeRequest{Columns: 1, Rows: 1}) {
		t.Error("window-change without a pty accepted")
	}
}

func TestPtyShell(t *testing.T) {
	t.Parallel()
	c := client(t)
	s := ptySession(t, c, 24, 80)
	stdin, err := s.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out testutil.SyncBuffer
	s.Stdout = &out
	if err := s.Shell(); err != nil {
		t.Fatalf("shell: %v", err)
	}
	if _, err := stdin.Write([]byte("exit 5\n")); err != nil {
		t.Fatal(err)
	}
	var ee *ssh.ExitError
	if err := s.Wait(); !errors.As(err, &ee) || ee.ExitStatus() != 5 {
		t.Fatalf("wait: %v (output %q), want exit status 5", err, out.String())
	}
}

func TestPtyCloseKillsCommand(t *testing.T) {
	t.Parallel()
	c := client(t)
	r := openSession(t, c)
	if !r.request(t, "pty-req", sshmsg.PtyRequest{Term: "xterm", Columns: 80, Rows: 24}) {
		t.Fatal("pty-req rejected")
	}
	if !r.execSpec(t, agentproto.ExecSpec{Argv: []string{"sh", "-c", "trap '' HUP; sleep 100 & echo $!; echo $$; wait"}}) {
		t.Fatal("exec rejected")
	}
	pids := waitPIDs(t, r, 2)
	r.ch.Close()
	waitGone(t, pids...)
}

func waitFor(t *testing.T, b *testutil.SyncBuffer, s string) {
	t.Helper()
	for range 3000 {
		if strings.Contains(b.String(), s) {
			return
		}
		sleepMillis(10)
	}
	t.Fatalf("output %q never contained %q", b.String(), s)
}

func TestPtyBackgroundChildDoesNotBlockExit(t *testing.T) {
	t.Parallel()
	c := client(t)
	r := openSession(t, c)
	if !r.request(t, "pty-req", sshmsg.PtyRequest{Term: "xterm", Columns: 80, Rows: 24}) {
		t.Fatal("pty-req rejected")
	}
	start := time.Now()
	// The background sleep ignores the hangup and keeps the terminal open.
	if !r.execSpec(t, argv("sh", "-c", "trap '' HUP; sleep 60 & echo $!; exit 4")) {
		t.Fatal("exec rejected")
	}
	pid := waitPID(t, r)
	defer syscall.Kill(pid, syscall.SIGKILL)
	if st := r.wait(t); st != 4 {
		t.Fatalf("status %d, want 4", st)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("exit reported after %v", d)
	}
}
