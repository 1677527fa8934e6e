package agent

import (
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

// startPty starts argv on a terminal of cols × rows.
func startPty(t *testing.T, term string, cols, rows uint32, argv ...string) *remote {
	t.Helper()
	r, err := open(t, client(t), agentproto.Open{Spec: agentproto.ExecSpec{Argv: argv}, PTY: &agentproto.PTY{Term: term, Columns: cols, Rows: rows}})
	if err != nil {
		t.Fatalf("open %v on a pty: %v", argv, err)
	}
	return r
}

func TestPtyExec(t *testing.T) {
	t.Parallel()
	r := startPty(t, "xterm-256color", 111, 33, "sh", "-c", "tty; echo $TERM; stty size; test -t 0 && test -t 1 && test -t 2 && echo terminal")
	if st := r.wait(t); st != 0 {
		t.Fatalf("status %d, output %q", st, r.stdout.String())
	}
	out := r.stdout.String()
	lines := strings.Split(strings.TrimRight(strings.ReplaceAll(out, "\r\n", "\n"), "\n"), "\n")
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
	if r.stderr.String() != "" {
		t.Errorf("stderr %q: a terminal's output all arrives as stdout", r.stderr.String())
	}
}

func TestPtyExitStatus(t *testing.T) {
	t.Parallel()
	r := startPty(t, "vt100", 80, 24, "sh", "-c", "test -t 0 || exit 9; echo $TERM; exit 7")
	if st := r.wait(t); st != 7 {
		t.Fatalf("status %d, stdout %q, want 7", st, r.stdout.String())
	}
	if got := r.stdout.String(); got != "vt100\r\n" {
		t.Errorf("stdout %q", got)
	}
}

func TestPtyResize(t *testing.T) {
	t.Parallel()
	// The kernel signals the terminal's foreground group on a new size;
	// the command reports the size it was given when that arrives.
	r := startPty(t, "xterm", 80, 24, "sh", "-c", "trap 'stty size; exit 0' WINCH; echo ready; while sleep 0.05; do :; done")
	waitFor(t, &r.stdout, "ready")
	if err := r.ch.Resize(132, 50); err != nil {
		t.Fatal(err)
	}
	if st := r.wait(t); st != 0 {
		t.Fatalf("status %d, output %q", st, r.stdout.String())
	}
	if got := r.stdout.String(); !strings.HasSuffix(got, "50 132\r\n") {
		t.Errorf("output %q, want the new size 50 132", got)
	}
}

func TestResizeWithoutPtyIsIgnored(t *testing.T) {
	t.Parallel()
	r := start(t, client(t), argv("sh", "-c", "read line; echo $line"))
	if err := r.ch.Resize(1, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ch.Write([]byte("still here\n")); err != nil {
		t.Fatal(err)
	}
	if st := r.wait(t); st != 0 || r.stdout.String() != "still here\n" {
		t.Fatalf("status %d, output %q", st, r.stdout.String())
	}
}

func TestPtyInteractiveShell(t *testing.T) {
	t.Parallel()
	r := startPty(t, "xterm", 80, 24, "sh", "-i")
	if _, err := r.ch.Write([]byte("exit 5\n")); err != nil {
		t.Fatal(err)
	}
	if st := r.wait(t); st != 5 {
		t.Fatalf("status %d (output %q), want 5", st, r.stdout.String())
	}
}

func TestPtyCloseKillsCommand(t *testing.T) {
	t.Parallel()
	r := startPty(t, "xterm", 80, 24, "sh", "-c", "trap '' HUP; sleep 100 & echo $!; echo $$; wait")
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
	start := time.Now()
	// The background sleep ignores the hangup and keeps the terminal open.
	r := startPty(t, "xterm", 80, 24, "sh", "-c", "trap '' HUP; sleep 60 & echo $!; exit 4")
	pid := waitPID(t, r)
	defer syscall.Kill(pid, syscall.SIGKILL)
	if st := r.wait(t); st != 4 {
		t.Fatalf("status %d, want 4", st)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("exit reported after %v", d)
	}
}
