package cli

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
)

// ttyPolicy allows sessions, and root for the command that reads a
// terminal's size from outside it.
var ttyPolicy = strings.Replace(servePolicy, "[profile.timeout]", "users = [\"agent\", \"root\"]\n[profile.sessions]\nallowed = true\n[profile.timeout]", 1)

// TestServe_TerminalResize: vm-exec -it on a terminal whose size changes
// sends the new size (SIGWINCH → a resize frame), and the guest's
// terminal takes it.
func TestServe_TerminalResize(t *testing.T) {
	s := startServeWith(t, t.TempDir(), ttyPolicy)
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 24, Cols: 80}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t, "vm-exec"), "--socket", s.socket, "-it", "--session", "term", "sh", "-c", "echo dev=$(tty) size=$(stty size); read x")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	var mu sync.Mutex
	var out bytes.Buffer
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := ptmx.Read(b)
			mu.Lock()
			out.Write(b[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	re := regexp.MustCompile(`dev=(/dev/pts/\d+) size=24 80`)
	var dev string
	for deadline := time.Now().Add(3 * time.Minute); dev == ""; time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		if m := re.FindStringSubmatch(out.String()); m != nil {
			dev = m[1]
		}
		got := out.String()
		mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("the command on a terminal did not answer: %q", got)
		}
	}
	if err := pty.Setsize(ptmx, &pty.Winsize{Rows: 40, Cols: 120}); err != nil {
		t.Fatal(err)
	}
	// The new size reaches the guest's terminal after the SIGWINCH, as it
	// does on any terminal: another command of the session reads it until
	// it shows.
	var size string
	for deadline := time.Now().Add(30 * time.Second); size != "40 120\n"; time.Sleep(100 * time.Millisecond) {
		var code int
		size, _, code = vmExec(t, s.socket, "--session", "term", "--user", "root", "stty", "-F", dev, "size")
		if code != 0 || time.Now().After(deadline) {
			t.Fatalf("the guest's terminal after a resize: %q (exit %d)", size, code)
		}
	}
	if _, err := ptmx.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("vm-exec -it: %v", err)
	}
}
