package agent

import (
	"bytes"
	"crypto/rand"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

func argv(a ...string) agentproto.ExecSpec { return agentproto.ExecSpec{Argv: a} }

func TestExecEcho(t *testing.T) {
	t.Parallel()
	c := client(t)
	res := run(t, c, argv("echo", "hello", "world"), nil)
	if res.status != 0 || res.stdout != "hello world\n" || res.stderr != "" {
		t.Fatalf("echo: %+v", res)
	}
}

func TestExecExitCodes(t *testing.T) {
	t.Parallel()
	c := client(t)
	for _, code := range []int{0, 1, 42, 255} {
		res := run(t, c, argv("sh", "-c", "exit "+strconv.Itoa(code)), nil)
		if res.status != code {
			t.Errorf("exit %d: got %+v", code, res)
		}
	}
}

func TestExecSeveralSessionsConcurrently(t *testing.T) {
	t.Parallel()
	c := client(t)
	results := make(chan string, 8)
	for i := range 8 {
		go func() {
			r, err := open(t, c, agentproto.Open{Spec: argv("sh", "-c", "sleep 0.2; echo "+strconv.Itoa(i))})
			if err != nil {
				results <- err.Error()
				return
			}
			_ = r.ch.CloseWrite()
			<-r.done
			results <- strings.TrimSpace(r.stdout.String())
		}()
	}
	seen := map[string]bool{}
	for range 8 {
		seen[<-results] = true
	}
	for i := range 8 {
		if !seen[strconv.Itoa(i)] {
			t.Errorf("missing output of session %d: %v", i, seen)
		}
	}
}

func TestExecNotFound(t *testing.T) {
	t.Parallel()
	c := client(t)
	res := run(t, c, argv("vmgate-no-such-command", "x"), nil)
	want := "vmgate-agent: vmgate-no-such-command: command not found\n"
	if res.status != agentproto.ExitNotFound || res.stderr != want || res.stdout != "" {
		t.Errorf("unknown command: %+v, want 127 and %q", res, want)
	}
	res = run(t, c, argv("/nonexistent/prog"), nil)
	if res.status != agentproto.ExitNotFound || !strings.Contains(res.stderr, "/nonexistent/prog: no such file or directory") {
		t.Errorf("missing absolute path: %+v", res)
	}
	// The lookup uses the PATH of the command's environment.
	res = run(t, c, agentproto.ExecSpec{Argv: []string{"echo", "x"}, Env: []string{"PATH=" + t.TempDir()}}, nil)
	if res.status != agentproto.ExitNotFound || !strings.Contains(res.stderr, "echo: command not found") {
		t.Errorf("echo with an empty PATH: %+v", res)
	}
}

func TestExecNotExecutable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := write("plain", "#!/bin/sh\necho hi\n", 0o644)
	garbage := write("garbage", "\x00\x01\x02 not a program\n", 0o755)
	c := client(t)
	for _, tc := range []struct {
		name   string
		spec   agentproto.ExecSpec
		reason string
	}{
		{"no execute bit", argv(plain), plain + ": permission denied"},
		{"no execute bit via PATH", agentproto.ExecSpec{Argv: []string{"plain"}, Env: []string{"PATH=" + dir}}, "plain: permission denied"},
		{"exec format error", argv(garbage), garbage + ": exec format error"},
		{"directory", argv(dir), dir + ": permission denied"},
	} {
		res := run(t, c, tc.spec, nil)
		if res.status != agentproto.ExitNotExecutable || res.stderr != "vmgate-agent: "+tc.reason+"\n" {
			t.Errorf("%s: %+v, want 126 and %q", tc.name, res, tc.reason)
		}
	}
}

func TestExecPathPrefersExecutable(t *testing.T) {
	t.Parallel()
	first, second := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(first, "prog"), []byte("#!/bin/sh\necho first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(second, "prog"), []byte("#!/bin/sh\necho second\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := client(t)
	res := run(t, c, agentproto.ExecSpec{Argv: []string{"prog"}, Env: []string{"PATH=" + first + ":" + second}}, nil)
	if res.status != 0 || res.stdout != "second\n" {
		t.Fatalf("prog: %+v", res)
	}
}

func TestExecStdinRoundTrip(t *testing.T) {
	t.Parallel()
	data := make([]byte, 1<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	c := client(t)
	r := start(t, c, argv("cat"))
	if _, err := r.ch.Write(data); err != nil {
		t.Fatalf("write stdin: %v", err)
	}
	if err := r.ch.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if st := r.wait(t); st != 0 {
		t.Fatalf("cat exited %d: %s", st, r.stderr.String())
	}
	if got := r.stdout.Bytes(); !bytes.Equal(got, data) {
		t.Fatalf("cat returned %d bytes that differ from the %d sent", len(got), len(data))
	}
}

func TestExecStdinEOFClosesInput(t *testing.T) {
	t.Parallel()
	c := client(t)
	res := run(t, c, argv("wc", "-c"), []byte("12345"))
	if res.status != 0 || strings.TrimSpace(res.stdout) != "5" {
		t.Fatalf("wc -c: %+v", res)
	}
}

func TestExecIgnoredStdinDoesNotBlock(t *testing.T) {
	t.Parallel()
	c := client(t)
	// true exits without reading 4 MiB of input; the host's writes must
	// still complete and the exit status must arrive.
	r := start(t, c, argv("true"))
	errc := make(chan error, 1)
	go func() {
		_, err := r.ch.Write(make([]byte, 4<<20))
		errc <- err
	}()
	if st := r.wait(t); st != 0 {
		t.Fatalf("true exited %d", st)
	}
	select {
	case <-errc: // done or failed because the channel closed; either is fine
	case <-time.After(testTimeout):
		t.Fatal("stdin write blocked")
	}
}

func TestExecStdoutStderrSeparate(t *testing.T) {
	t.Parallel()
	c := client(t)
	res := run(t, c, argv("sh", "-c", "echo out1; echo err1 >&2; echo out2; echo err2 >&2"), nil)
	if res.status != 0 || res.stdout != "out1\nout2\n" || res.stderr != "err1\nerr2\n" {
		t.Fatalf("got %+v", res)
	}
}

func TestExecLargeOutputComplete(t *testing.T) {
	t.Parallel()
	c := client(t)
	res := run(t, c, argv("sh", "-c", "head -c 3000000 /dev/zero; head -c 1000000 /dev/zero >&2"), nil)
	if res.status != 0 || len(res.stdout) != 3000000 || len(res.stderr) != 1000000 {
		t.Fatalf("status %d, %d bytes stdout, %d bytes stderr", res.status, len(res.stdout), len(res.stderr))
	}
}

func TestExecEnvironment(t *testing.T) {
	t.Parallel()
	c := client(t)
	r := start(t, c, agentproto.ExecSpec{
		Argv: []string{"env"},
		Env:  []string{"LANG=C", "BOTH=first", "BOTH=from-spec", "FROM_SPEC=spec", "EMPTY=", "LANG=en_US.UTF-8"},
	})
	_ = r.ch.CloseWrite()
	if st := r.wait(t); st != 0 {
		t.Fatalf("env exited %d", st)
	}
	got := map[string]string{}
	for line := range strings.Lines(r.stdout.String()) {
		k, v, _ := strings.Cut(strings.TrimSuffix(line, "\n"), "=")
		if _, dup := got[k]; dup {
			t.Errorf("variable %s appears twice", k)
		}
		got[k] = v
	}
	home := "/root"
	if u, err := user.Lookup("root"); err == nil {
		home = u.HomeDir
	}
	want := map[string]string{
		"PATH":      basePath,
		"HOME":      home,
		"USER":      "root",
		"LOGNAME":   "root",
		"SHELL":     loginShell(passwdPath, "root"),
		"LANG":      "en_US.UTF-8",
		"FROM_SPEC": "spec",
		"BOTH":      "from-spec",
		"EMPTY":     "",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["TERM"]; ok {
		t.Error("TERM is set without a pty")
	}
	if len(got) != len(want) {
		t.Errorf("environment has extra variables: %v", got)
	}
}

func TestExecDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	c := client(t)
	res := run(t, c, agentproto.ExecSpec{Argv: []string{"pwd"}, Dir: dir}, nil)
	if res.status != 0 || res.stdout != dir+"\n" {
		t.Errorf("pwd in %s: %+v", dir, res)
	}
	// Relative program paths are resolved in the working directory.
	if err := os.WriteFile(filepath.Join(dir, "sub", "prog"), []byte("#!/bin/sh\necho relative\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	res = run(t, c, agentproto.ExecSpec{Argv: []string{"./prog"}, Dir: filepath.Join(dir, "sub")}, nil)
	if res.status != 0 || res.stdout != "relative\n" {
		t.Errorf("./prog: %+v", res)
	}
	res = run(t, c, argv("pwd"), nil)
	if want := workDir("", rootIdentity().home) + "\n"; res.status != 0 || res.stdout != want {
		t.Errorf("pwd without dir: %+v, want %q", res, want)
	}
	missing := filepath.Join(dir, "missing")
	res = run(t, c, agentproto.ExecSpec{Argv: []string{"pwd"}, Dir: missing}, nil)
	want := "vmgate-agent: cd " + missing + ": no such file or directory\n"
	if res.status != agentproto.ExitNotExecutable || res.stderr != want {
		t.Errorf("pwd in a missing dir: %+v, want 126 and %q", res, want)
	}
}

func TestInvalidCommands(t *testing.T) {
	t.Parallel()
	c := client(t)
	for _, tc := range []struct {
		o      agentproto.Open
		reason string
	}{
		{agentproto.Open{Spec: argv()}, "argv is empty"},
		{agentproto.Open{Spec: argv("")}, "argv[0] is empty"},
		{agentproto.Open{Spec: argv("echo", "a\x00b")}, "argv[1] contains a NUL byte"},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"echo"}, Env: []string{"NOEQUALS"}}}, "env[0]"},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"echo"}, Env: []string{"=x"}}}, "env[0]"},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"echo"}, Dir: "/tmp\x00"}}, "dir contains a NUL byte"},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"echo"}, User: "no:body"}}, `user "no:body" is not an account name`},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"echo"}, User: strings.Repeat("u", agentproto.MaxUserName+1)}}, "is not an account name"},
		{agentproto.Open{Spec: argv("echo"), PTY: &agentproto.PTY{Term: "xterm", Columns: 1 << 20, Rows: 24}}, "invalid terminal"},
		{agentproto.Open{Spec: argv("echo"), PTY: &agentproto.PTY{Term: "x\nterm", Columns: 80, Rows: 24}}, "invalid terminal"},
	} {
		if got := refusal(t, c, tc.o); !strings.Contains(got, tc.reason) {
			t.Errorf("%+v: refused with %q, want a reason containing %q", tc.o, got, tc.reason)
		}
	}
	// The connection goes on after refusals.
	if res := run(t, c, argv("echo", "ok"), nil); res.status != 0 || res.stdout != "ok\n" {
		t.Fatalf("after the refusals: %+v", res)
	}
}

// TestOpenDecodedStrictly: an open the agent cannot decode exactly is
// refused with the reason, the connection going on.
func TestOpenDecodedStrictly(t *testing.T) {
	t.Parallel()
	h := startAgent(t, nil).connect(t)
	good := encode(agentproto.Open{Spec: argv("echo")})
	for i, tc := range []struct {
		p      []byte
		reason string
	}{
		{append(append([]byte(nil), good...), 0), "1 bytes after the open"},
		{good[:len(good)-2], "too short"},
		{nil, "too short"},
	} {
		id := uint32(i + 1)
		h.send(agentproto.FrameOpen, id, tc.p)
		f := h.read()
		if f.Type != agentproto.FrameOpenFail || f.ID != id || !strings.Contains(string(f.Payload), tc.reason) {
			t.Errorf("%q: answer %v %d %q, want open-fail with %q", tc.p, f.Type, f.ID, f.Payload, tc.reason)
		}
	}
}

func TestSignalTerm(t *testing.T) {
	t.Parallel()
	c := client(t)
	r := start(t, c, argv("sh", "-c", "sleep 100 & echo $!; echo $$; wait"))
	pids := waitPIDs(t, r, 2)
	// An unknown signal is ignored; TERM reaches the command.
	if err := r.ch.Signal("NOPE"); err != nil {
		t.Fatal(err)
	}
	if err := r.ch.Signal("TERM"); err != nil {
		t.Fatal(err)
	}
	if e := r.exit(t); e.Signal != "TERM" {
		t.Fatalf("exit %+v, want the signal TERM", e)
	}
	// The signal went to the whole process group, the background sleep too.
	waitGone(t, pids...)
}

func TestSignalInt(t *testing.T) {
	t.Parallel()
	c := client(t)
	r := start(t, c, argv("sh", "-c", "echo $$; exec sleep 100"))
	waitPID(t, r)
	if err := r.ch.Signal("INT"); err != nil {
		t.Fatal(err)
	}
	if e := r.exit(t); e.Signal != "INT" {
		t.Fatalf("exit %+v, want the signal INT", e)
	}
}

func TestExitSignalKill(t *testing.T) {
	t.Parallel()
	c := client(t)
	res := run(t, c, argv("sh", "-c", "echo before; kill -KILL $$"), nil)
	if res.status != -1 || res.signal != "KILL" || res.stdout != "before\n" {
		t.Fatalf("got %+v, want exit-signal KILL after the output", res)
	}
}

func TestClosingSessionKillsCommand(t *testing.T) {
	t.Parallel()
	c := client(t)
	r := start(t, c, argv("sh", "-c", "sleep 100 & echo $!; echo $$; exec sleep 101"))
	pids := waitPIDs(t, r, 2)
	if err := r.ch.Close(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, pids...)
	// The channel was closed before the command ended: no exit report.
	<-r.done
	if e, ok := r.ch.ExitStatus(); ok {
		t.Errorf("exit reported after the host closed the channel: %+v", e)
	}
}

func TestDroppedConnectionKillsCommand(t *testing.T) {
	t.Parallel()
	a := startAgent(t, nil)
	c := a.dial(t)
	r := start(t, c, argv("sh", "-c", "sleep 100 & echo $!; echo $$; wait"))
	pids := waitPIDs(t, r, 2)
	a.conn.Close()
	_ = a.waitServe(t)
	// Serve reaped the command before returning; the orphaned background
	// sleep was killed with its process group.
	if !processGone(pids[1]) {
		t.Errorf("command %d still exists after Serve returned", pids[1])
	}
	waitGone(t, pids...)
}

func TestBackgroundChildDoesNotBlockExit(t *testing.T) {
	t.Parallel()
	c := client(t)
	start := time.Now()
	res := run(t, c, argv("sh", "-c", "sleep 60 & echo $!"), nil)
	elapsed := time.Since(start)
	if res.status != 0 {
		t.Fatalf("got %+v", res)
	}
	if elapsed > 10*time.Second {
		t.Errorf("took %v: a background child holding stdout delayed the exit", elapsed)
	}
	if pid, err := strconv.Atoi(strings.TrimSpace(res.stdout)); err == nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func TestUnprivilegedUser(t *testing.T) {
	t.Parallel()
	u, err := user.Lookup(agentproto.UnprivilegedUser)
	if err != nil {
		t.Skipf("no %q user on this host: %v", agentproto.UnprivilegedUser, err)
	}
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	c := client(t)
	res := run(t, c, agentproto.ExecSpec{Argv: []string{"sh", "-c", "id -u; id -g; echo $USER $HOME"}, User: agentproto.UnprivilegedUser}, nil)
	want := u.Uid + "\n" + u.Gid + "\n" + u.Username + " " + u.HomeDir + "\n"
	if res.status != 0 || res.stdout != want {
		t.Fatalf("got %+v, want stdout %q", res, want)
	}
}

// TestAnyUser: a command may run as any account of the guest's; one the
// guest does not have ends with 126 and a message naming it, as other
// start failures do.
func TestAnyUser(t *testing.T) {
	t.Parallel()
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no nobody account on this host: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	c := client(t)
	res := run(t, c, agentproto.ExecSpec{Argv: []string{"sh", "-c", "id -u; id -g; echo $USER"}, User: "nobody", Dir: "/"}, nil)
	if want := u.Uid + "\n" + u.Gid + "\nnobody\n"; res.status != 0 || res.stdout != want {
		t.Errorf("as nobody: %+v, want stdout %q", res, want)
	}
	// A user the guest has no account for: the command is refused, never
	// started (the host reports the guest's refusal).
	if why := refusal(t, c, agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"true"}, User: "vmgate-no-such-user"}}); why != `user "vmgate-no-such-user": no such account in this guest` {
		t.Errorf("as a missing account: refused with %q", why)
	}
}

// TestExecRefusesRootAgent: when the guest's account database gives the
// unprivileged user uid 0, a command for that user does not run: it is
// refused, with the reason.
func TestExecRefusesRootAgent(t *testing.T) {
	t.Parallel()
	c := startAgent(t, func(cfg *Config) { cfg.lookupUser = fakeAccounts("0", "0") }).dial(t)
	marker := filepath.Join(t.TempDir(), "ran")
	why := refusal(t, c, agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"touch", marker}, User: agentproto.UnprivilegedUser}})
	if want := "user agent has uid 0, gid 0 in this guest: it is root's, not an unprivileged user: refusing to run the command as it"; why != want {
		t.Errorf("refused with %q, want %q", why, want)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran")
	}
	// Root's commands still run on that connection.
	if res := run(t, c, agentproto.ExecSpec{Argv: []string{"true"}}, nil); res.status != 0 {
		t.Errorf("root's command: %+v", res)
	}
}

// TestCredentialSwitch checks the credential handling of newCommand with an
// account that exists on every test host, independently of the "agent" user.
func TestCredentialSwitch(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	id := identity{name: "nobody", uid: 65534, gid: 65534, groups: []uint32{65534}, home: "/", shell: "/bin/sh", switchCred: true}
	cmd := newCommand("/bin/sh", []string{"sh", "-c", "id -u; id -g; id -G"}, buildEnv(id, "", nil, nil), "/", id, false)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("run as nobody: %v", err)
	}
	if string(out) != "65534\n65534\n65534\n" {
		t.Fatalf("id output %q", out)
	}
}

// TestNoGoroutineLeak runs a mix of sessions, drops the connection and checks
// that no goroutine of the agent survives Serve.
func TestNoGoroutineLeak(t *testing.T) {
	a := startAgent(t, nil)
	c := a.dial(t)
	run(t, c, argv("echo", "x"), []byte("input"))
	run(t, c, argv("vmgate-no-such-command"), nil)
	bg := run(t, c, argv("sh", "-c", "sleep 30 & echo $!"), nil) // background child
	if pid, err := strconv.Atoi(strings.TrimSpace(bg.stdout)); err == nil {
		defer syscall.Kill(pid, syscall.SIGKILL)
	}
	start(t, c, argv("sleep", "100"))
	refusal(t, c, agentproto.Open{Spec: argv("")}) // never starts a command
	a.conn.Close()
	_ = a.waitServe(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		leaked := agentGoroutines()
		if leaked == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left after Serve returned:\n%s", leaked)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// agentGoroutines returns the stacks of goroutines running agent code,
// other than tests.
func agentGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var leaked []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "guest/agent.Test") || strings.Contains(g, "guest/agent.open") {
			continue
		}
		if strings.Contains(g, "vmgate/guest/agent.") || strings.Contains(g, "vmgate/guest/agentconn.") {
			leaked = append(leaked, g)
		}
	}
	return strings.Join(leaked, "\n\n")
}
