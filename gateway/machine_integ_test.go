package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/bytestr"
	"github.com/vmgate/vmgate/internal/testutil"
)

// machinePolicy: a session runs 3 commands and 8 background processes at
// once, keeps 64 KiB of each one's streams; a caller may run as agent,
// root, or ghost (an account the guest does not have).
const machinePolicy = `version = 1
[[profile]]
name = "test"
match = { any = true }
user = "agent"
users = ["agent", "root", "ghost"]
allow_shell = true
max_vms = 4
max_vms_per_caller = 4
[profile.timeout]
default = "60s"
max = "10m"
[profile.sessions]
allowed = true
max_commands = 3
max_processes = 8
process_buffer = "64KiB"
`

// TestGateway_SessionIsAMachine: a session runs commands at once and
// keeps background processes that outlive their clients, a pause, a fork
// and a daemon's restart; commands run as any user the profile allows;
// file operations run in the guest as that user (issue 44).
func TestGateway_SessionIsAMachine(t *testing.T) {
	testutil.RequiresImage(t)
	state := t.TempDir()
	config := func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir, c.VM.StateDir = false, 0, testutil.TemplateDir(t), state
		c.AuditPath, c.MaxVMs, c.QueueWait, c.Grace = filepath.Join(state, "audit.jsonl"), 4, 3*time.Second, 20*time.Second
	}
	d := gatewaytest.Start(t, machinePolicy, config)
	outer := t // a daemon started again lives as long as the test
	ctx := context.Background()
	run := func(session, cmd string) (*wire.Result, string, string) {
		t.Helper()
		res, so, se, err := d.Exec(t, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: session}, nil)
		if err != nil {
			t.Fatalf("%s in %s: %v", cmd, session, err)
		}
		return res, so, se
	}
	run("m", "true")
	var termed int64 // the handle of the process ended by TERM

	t.Run("commands at once", func(t *testing.T) {
		first := make(chan error, 1)
		go func() {
			res, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"sleep 9"}, Shell: true, Session: "m"}, nil)
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exit %d", res.ExitCode)
			}
			first <- err
		}()
		time.Sleep(500 * time.Millisecond) // the first runs
		t0 := time.Now()
		if _, so, _ := run("m", "echo second"); so != "second\n" {
			t.Errorf("the second command: %q", so)
		}
		if took := time.Since(t0); took > 1500*time.Millisecond {
			t.Errorf("the second command answered after %v while the first ran: serialised", took)
		}
		select {
		case err := <-first:
			t.Errorf("the first command ended before the second answered: %v", err)
		default:
		}
		// Two more fill max_commands (3); the fourth is refused after the
		// wait, naming the key.
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { run("m", "sleep 7") })
		}
		time.Sleep(time.Second)
		_, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "m"}, nil)
		var fe *client.ExecFailedError
		var ae *client.APIError
		switch {
		case errors.As(err, &ae) && ae.Body.Code == wire.CodeBusy && strings.Contains(ae.Body.Error, "sessions.max_commands"):
		case errors.As(err, &fe) && strings.Contains(fe.Body.Error, "sessions.max_commands"):
		default:
			t.Errorf("a command past sessions.max_commands: %v", err)
		}
		wg.Wait()
		if err := <-first; err != nil {
			t.Errorf("the first command: %v", err)
		}
	})

	t.Run("users", func(t *testing.T) {
		for user, want := range map[string]string{"": "agent", "agent": "agent", "root": "root"} {
			res, so, se, err := d.Exec(t, wire.ExecRequest{Argv: []string{"id", "-un"}, Session: "m", User: user}, nil)
			if err != nil || res.ExitCode != 0 || so != want+"\n" {
				t.Errorf("as %q: %v %+v %q %q", user, err, res, so, se)
			}
		}
		_, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"id"}, Session: "m", User: "postgres"}, nil)
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Body.ExitCode() != wire.ExitDenied || ae.Body.Rule != "users" {
			t.Errorf("a user outside users: %v", err)
		}
		res, _, se, err := d.Exec(t, wire.ExecRequest{Argv: []string{"id"}, Session: "m", User: "ghost"}, nil)
		var fe *client.ExecFailedError
		switch {
		case errors.As(err, &fe) && fe.Body.ExitCode() == wire.ExitVMFailed && strings.Contains(fe.Body.Error, "ghost"):
		case err == nil && strings.Contains(se, "ghost"):
			t.Errorf("a user the guest does not have ran as a command that failed (exit %d, %q): want the guest's refusal (205)", res.ExitCode, se)
		default:
			t.Errorf("a user the guest does not have: %v %+v %q", err, res, se)
		}
	})

	t.Run("background processes", func(t *testing.T) {
		p, err := d.Client.StartProc(ctx, "m", wire.ExecRequest{Argv: []string{`echo out; echo err >&2; trap 'exit 3' TERM; while :; do sleep 0.1; done`}, Shell: true, User: "root"})
		if err != nil {
			t.Fatal(err)
		}
		if p.Handle <= 0 || p.State != wire.ProcRunning || p.User != "root" {
			t.Fatalf("started %+v", p)
		}
		var out, errOut bytes.Buffer
		waitFor(t, 30*time.Second, "its output", func() bool {
			out.Reset()
			errOut.Reset()
			_ = d.Client.ProcLogs(ctx, "m", p.Handle, 0, 0, false, func(o wire.ProcOutput) error { return sortChunks(o, &out, &errOut) })
			return out.String() == "out\n" && errOut.String() == "err\n"
		})
		if err := d.Client.ProcSignal(ctx, "m", p.Handle, "TERM"); err != nil {
			t.Fatal(err)
		}
		end, err := d.Client.ProcWait(ctx, "m", p.Handle, 30*time.Second)
		if code, ok := end.ExitStatus(); err != nil || !ok || code != 3 {
			t.Errorf("after TERM: %+v %v", end, err)
		}
		termed = p.Handle
		// Another session's handle, and another caller's session: not found.
		run("other", "true")
		if err := d.Client.ProcSignal(ctx, "other", p.Handle, "KILL"); !isNotFound(err) {
			t.Errorf("the handle in another session: %v", err)
		}
		if out, code := asNobody(t, d.Socket, "--session", "m", "--logs", strconv.FormatInt(p.Handle, 10)); code != wire.ExitInternal || out != "" {
			t.Errorf("another caller's logs: exit %d %q", code, out)
		}
		if err := d.Client.EndSession(ctx, "other"); err != nil {
			t.Error(err)
		}
	})

	t.Run("a time limit", func(t *testing.T) {
		// The limit kills the process with its whole tree.
		p, err := d.Client.StartProc(ctx, "m", wire.ExecRequest{Argv: []string{"sleep 301 & sleep 302 & wait"}, Shell: true, TimeoutMS: 1500})
		if err != nil {
			t.Fatal(err)
		}
		end, err := d.Client.ProcWait(ctx, "m", p.Handle, 60*time.Second)
		if _, ok := end.ExitStatus(); err != nil || !ok || !end.TimedOut {
			t.Errorf("a process past its time limit: %+v %v", end, err)
		}
		if _, so, _ := run("m", "pgrep -c -f 'sleep 30[12]'; true"); strings.TrimSpace(so) != "0" {
			t.Errorf("%q of its children outlived the process", strings.TrimSpace(so))
		}
		// A limit past the profile's timeout.max is refused.
		_, err = d.Client.StartProc(ctx, "m", wire.ExecRequest{Argv: []string{"true"}, TimeoutMS: (11 * time.Minute).Milliseconds()})
		var ae *client.APIError
		if !errors.As(err, &ae) || ae.Body.ExitCode() != wire.ExitDenied {
			t.Errorf("a process with a limit past timeout.max: %v", err)
		}
	})

	t.Run("a process that writes without end", func(t *testing.T) {
		p, err := d.Client.StartProc(ctx, "m", wire.ExecRequest{Argv: []string{"yes"}})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 60*time.Second, "4 MiB of output", func() bool {
			ps, err := d.Client.Procs(ctx, "m")
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range ps {
				if q.Handle == p.Handle {
					return q.StdoutBytes > 4<<20
				}
			}
			return false
		})
		var now wire.Proc
		_ = d.Client.ProcLogs(ctx, "m", p.Handle, 0, 0, false, func(o wire.ProcOutput) error {
			for _, c := range o.Chunks {
				if len(c.Data) > 64<<10 {
					t.Errorf("a chunk of %d bytes", len(c.Data))
				}
			}
			now = o.Proc
			return nil
		})
		if kept := now.StdoutBytes - now.StdoutDropped; now.StdoutDropped == 0 || kept > 64<<10 {
			t.Errorf("%d bytes written, %d dropped: %d kept, want at most its 64 KiB buffer", now.StdoutBytes, now.StdoutDropped, kept)
		}
		_, so, _ := run("m", "ps -o rss= -C vmgate-agent | sort -n | tail -1")
		if rss, _ := strconv.Atoi(strings.TrimSpace(so)); rss == 0 || rss > 64<<10 {
			t.Errorf("the guest agent's RSS is %q KiB with a process writing without end", strings.TrimSpace(so))
		}
		if err := d.Client.ProcSignal(ctx, "m", p.Handle, "KILL"); err != nil {
			t.Error(err)
		}
	})

	t.Run("past max_processes", func(t *testing.T) {
		started, refused := 0, 0
		for range 1000 {
			_, err := d.Client.StartProc(ctx, "m", wire.ExecRequest{Argv: []string{"sleep", "600"}})
			var ae *client.APIError
			switch {
			case err == nil:
				started++
			case errors.As(err, &ae) && ae.Body.Rule == "sessions.max_processes":
				refused++
			default:
				t.Fatalf("a start: %v", err)
			}
		}
		if started != 8 || refused != 992 {
			t.Errorf("1000 starts: %d started, %d refused; want 8 and 992 (sessions.max_processes = 8)", started, refused)
		}
		if _, so, _ := run("m", "pgrep -c -x sleep"); strings.TrimSpace(so) != "8" {
			t.Errorf("%q sleeps run in the guest, want 8", so)
		}
		run("m", "pkill -x sleep; true")
	})

	t.Run("an attached client killed", func(t *testing.T) {
		p, err := d.Client.StartProc(ctx, "m", wire.ExecRequest{Argv: []string{`i=0; while :; do i=$((i+1)); echo line $i; sleep 0.2; done`}, Shell: true})
		if err != nil {
			t.Fatal(err)
		}
		bin := os.Getenv("VMGATE_TEST_BIN")
		if bin == "" {
			t.Skip("VMGATE_TEST_BIN not set")
		}
		att := exec.Command(filepath.Join(bin, "vm-exec"), "--socket", d.Socket, "--session", "m", "--attach", strconv.FormatInt(p.Handle, 10))
		var seen bytes.Buffer
		att.Stdout = &seen
		if err := att.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		_ = att.Process.Signal(syscall.SIGKILL)
		_ = att.Wait()
		ps, _ := d.Client.Procs(ctx, "m")
		var now wire.Proc
		for _, q := range ps {
			if q.Handle == p.Handle {
				now = q
			}
		}
		if now.State != wire.ProcRunning {
			t.Fatalf("after its attached client was killed: %+v", now)
		}
		var again bytes.Buffer
		_ = d.Client.ProcLogs(ctx, "m", p.Handle, 0, 0, false, func(o wire.ProcOutput) error { return sortChunks(o, &again, &again) })
		if !strings.HasPrefix(again.String(), "line 1\n") || !strings.Contains(again.String(), "line 5\n") {
			t.Errorf("another client reads from offset 0: %q", again.String())
		}
		_ = d.Client.ProcSignal(ctx, "m", p.Handle, "KILL")
	})

	t.Run("pause, resume, fork, restart", func(t *testing.T) {
		p, err := d.Client.StartProc(ctx, "m", wire.ExecRequest{Argv: []string{`for i in $(seq 1 40); do echo tick $i; sleep 0.25; done; exit 7`}, Shell: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Client.PauseSession(ctx, "m"); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Client.ForkSession(ctx, "m", []string{"m2"}); err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"m", "m2"} {
			end, err := d.Client.ProcWait(ctx, s, p.Handle, 60*time.Second)
			if code, ok := end.ExitStatus(); err != nil || !ok || code != 7 {
				t.Errorf("%s: the process after a pause: %+v %v", s, end, err)
				continue
			}
			var out bytes.Buffer
			_ = d.Client.ProcLogs(ctx, s, p.Handle, 0, 0, false, func(o wire.ProcOutput) error { return sortChunks(o, &out, &out) })
			if lines := strings.Count(out.String(), "\n"); lines != 40 {
				t.Errorf("%s: %d lines of 40 after a pause", s, lines)
			}
		}
		q, err := d.Client.StartProc(ctx, "m", wire.ExecRequest{Argv: []string{`sleep 3; echo survived; exit 5`}, Shell: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		d2 := gatewaytest.Start(outer, machinePolicy, config)
		end, err := d2.Client.ProcWait(ctx, "m", q.Handle, 60*time.Second)
		if code, ok := end.ExitStatus(); err != nil || !ok || code != 5 {
			t.Errorf("a process across a restart: %+v %v", end, err)
		}
		d = d2
	})

	t.Run("file operations", func(t *testing.T) {
		f := func(path string) wire.FileRequest { return wire.FileRequest{Path: path} }
		if err := d.Client.FileOp(ctx, "m", wire.FileOpMkdir, wire.FileRequest{Path: "/tmp/fo/a/b", Parents: true}); err != nil {
			t.Fatal(err)
		}
		if n, err := d.Client.FileWrite(ctx, "m", f("/tmp/fo/a/b/x"), 0o600, strings.NewReader("hello")); err != nil || n != 5 {
			t.Fatalf("write: %d %v", n, err)
		}
		e, err := d.Client.FileStat(ctx, "m", f("/tmp/fo/a/b/x"))
		if err != nil || e.Type != wire.FileTypeRegular || e.Size != 5 || e.Mode != 0o600 || e.Owner != "agent" {
			t.Errorf("stat: %+v %v", e, err)
		}
		if err := d.Client.FileOp(ctx, "m", wire.FileOpMove, wire.FileRequest{Path: "/tmp/fo/a/b/x", To: "/tmp/fo/y"}); err != nil {
			t.Error(err)
		}
		l, err := d.Client.FileList(ctx, "m", wire.FileRequest{Path: "/tmp/fo", Depth: 3})
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		var listed []string
		for _, e := range l.Entries {
			listed = append(listed, e.Path)
		}
		if err != nil || strings.Join(listed, " ") != "/tmp/fo/a /tmp/fo/a/b /tmp/fo/y" {
			t.Errorf("list: %v %v", listed, err)
		}
		var got bytes.Buffer
		if _, err := d.Client.FileRead(ctx, "m", f("/tmp/fo/y"), &got); err != nil || got.String() != "hello" {
			t.Errorf("read: %q %v", got.String(), err)
		}
		// As agent, root's files are root's.
		var ae *client.APIError
		if _, err := d.Client.FileRead(ctx, "m", f("/etc/shadow"), &got); !errors.As(err, &ae) || ae.Body.FileError != wire.FileDenied {
			t.Errorf("read /etc/shadow as agent: %v", err)
		}
		if _, err := d.Client.FileRead(ctx, "m", wire.FileRequest{Path: "/etc/shadow", User: "root"}, &bytes.Buffer{}); err != nil {
			t.Errorf("read /etc/shadow as root: %v", err)
		}
		if _, err := d.Client.FileStat(ctx, "m", f("/tmp/fo/none")); !errors.As(err, &ae) || ae.Body.FileError != wire.FileNotFound || ae.Status != 404 {
			t.Errorf("stat of nothing: %v", err)
		}
		if err := d.Client.FileOp(ctx, "m", wire.FileOpRemove, wire.FileRequest{Path: "/tmp/fo", Recursive: true}); err != nil {
			t.Error(err)
		}
		// Two commands writing one file at once, as on one machine.
		var wg sync.WaitGroup
		for _, tag := range []string{"a", "b"} {
			wg.Go(func() { run("m", "for i in $(seq 1 300); do echo "+tag+"$i >> /tmp/both; done") })
		}
		wg.Wait()
		if _, so, _ := run("m", "wc -l < /tmp/both"); strings.TrimSpace(so) != "600" {
			t.Errorf("two commands appending at once wrote %q lines, want 600", so)
		}
	})

	// Each background process is one record from start to end (its
	// stderr: "err", and the shell's word on the sleep TERM ended); each
	// file operation is one record; each says which guest user it ran as.
	t.Run("audit", func(t *testing.T) {
		var ends, files []audit.Record
		root := false
		for _, r := range testutil.JSONLines[audit.Record](t, filepath.Join(state, "audit.jsonl")) {
			switch {
			case r.Kind == audit.KindExec && r.Process == termed && termed != 0 && r.Session == "m":
				ends = append(ends, r)
			case r.Kind == audit.KindFile && r.File != nil:
				files = append(files, r)
			case r.Kind == audit.KindExec && r.Process == 0 && r.GuestUser == "root" && slices.Equal(r.Argv, bytestr.List{"id", "-un"}):
				root = true
			}
		}
		if len(ends) != 1 || ends[0].ExitCode == nil || *ends[0].ExitCode != 3 || ends[0].GuestUser != "root" ||
			ends[0].StdoutBytes != 4 || ends[0].StderrBytes < 4 || ends[0].DurationMS <= 0 || ends[0].Session != "m" {
			t.Errorf("the records of process %d: %+v", termed, ends)
		}
		if !root {
			t.Error("no record of id -un as root says guest_user root")
		}
		var ops []string
		for _, r := range files {
			if r.GuestUser == "" || r.Session != "m" {
				t.Errorf("a file record without its user or session: %+v", r)
			}
			op := r.File.Op
			if r.File.Bytes > 0 {
				op += fmt.Sprint("=", r.File.Bytes)
			}
			ops = append(ops, op)
		}
		for _, want := range []string{"mkdir", "write=5", "stat", "move", "list", "read=5", "remove"} {
			if !slices.Contains(ops, want) {
				t.Errorf("no file record %s in %v", want, ops)
			}
		}
	})
}

// sortChunks writes a page's chunks to out or errOut by their stream.
func sortChunks(o wire.ProcOutput, out, errOut *bytes.Buffer) error {
	for _, c := range o.Chunks {
		if c.Stream == wire.StreamStderr {
			errOut.Write(c.Data)
		} else {
			out.Write(c.Data)
		}
	}
	return nil
}

func isNotFound(err error) bool {
	var ae *client.APIError
	return errors.As(err, &ae) && ae.Status == 404
}
