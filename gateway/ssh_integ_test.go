package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
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

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/sshfront"
	"github.com/vmgate/vmgate/gateway/wire"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/internal/testutil"
)

// sshIntegPolicy: "agent" runs shell strings and interactive shells,
// "narrow" runs nothing over SSH (shell strings are off).
const sshIntegPolicy = `version = 1
[[profile]]
name = "agent"
match = { ssh = true }
allow_shell = true
env = ["GREETING"]
max_vms = 3
[profile.timeout]
default = "60s"
max = "5m"
[profile.sessions]
allowed = true
idle_timeout = "5m"
max_lifetime = "10m"

[[profile]]
name = "narrow"
match = { ssh = true }
allow_shell = false

[[profile]]
name = "brief"
match = { ssh = true }
allow_shell = true
sessions = { allowed = true, idle_timeout = "3s", max_lifetime = "10m" }
`

// sshClientKey writes an ed25519 private key in OpenSSH's format for the
// ssh client and returns its path and public key.
func sshClientKey(t *testing.T, dir, name string) (string, ssh.PublicKey) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, name)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return p, signer.PublicKey()
}

// sshDial logs in as "agent" with Go's SSH client to the SSH door at addr,
// with the private key in keyFile, pinning the host key hostPub
// (authorized_keys form).
func sshDial(t *testing.T, addr, keyFile string, hostPub []byte) *ssh.Client {
	t.Helper()
	pem, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.ParsePrivateKey(pem)
	if err != nil {
		t.Fatal(err)
	}
	hk, _, _, _, err := ssh.ParseAuthorizedKey(hostPub)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{User: "agent",
		Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: ssh.FixedHostKey(hk), Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

func authorizedLine(opts string, k ssh.PublicKey, comment string) string {
	return opts + " " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k))) + " " + comment + "\n"
}

// TestGateway_SSH runs OpenSSH's ssh client against the real daemon's SSH
// front door, with the host key pinned (StrictHostKeyChecking=yes) and
// BatchMode, as llama-server's --tools-runtime ssh: runs it.
func TestGateway_SSH(t *testing.T) {
	testutil.RequiresImage(t)
	sshBin, err := exec.LookPath("ssh")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI: ssh not installed (apt-get install openssh-client)")
		}
		t.Skip("ssh not installed (apt-get install openssh-client)")
	}
	dir := t.TempDir()
	agentKey, agentPub := sshClientKey(t, dir, "agent_key")
	narrowKey, narrowPub := sshClientKey(t, dir, "narrow_key")
	strangerKey, _ := sshClientKey(t, dir, "stranger_key")
	briefKey, briefPub := sshClientKey(t, dir, "brief_key")
	keysFile := filepath.Join(dir, "authorized_keys")
	if err := os.WriteFile(keysFile, []byte("# test keys\n"+authorizedLine(`profile="agent"`, agentPub, "agent@integ")+
		authorizedLine(`profile="narrow"`, narrowPub, "narrow@integ")+authorizedLine(`profile="brief"`, briefPub, "brief@integ")), 0o600); err != nil {
		t.Fatal(err)
	}
	polFile := filepath.Join(dir, "ssh-policy.toml")
	if err := os.WriteFile(polFile, []byte(sshIntegPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	d := startDaemon(t, func(c *gateway.Config) {
		c.PolicyPath = polFile
		c.SSH = &sshfront.Config{Listeners: []net.Listener{ln}, AuthorizedKeys: keysFile}
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir, c.MaxVMs = false, 1, testutil.TemplateDir(t), 3
	})

	// The daemon created its host key; the client pins it.
	hostKey := filepath.Join(d.Config.VM.StateDir, sshfront.DefaultHostKey)
	if st, err := os.Stat(hostKey); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("host key: %v %v", st, err)
	}
	pub, err := os.ReadFile(hostKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	knownHosts := filepath.Join(dir, "known_hosts")
	hostField := "[127.0.0.1]:" + strconv.Itoa(port)
	if err := os.WriteFile(knownHosts, []byte(hostField+" "+string(pub)), 0o644); err != nil {
		t.Fatal(err)
	}

	// extra comes first: for ssh the first value given for an option wins.
	sshArgs := func(key string, extra ...string) []string {
		return append(extra, "-F", "/dev/null", "-p", strconv.Itoa(port), "-i", key, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
			"-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile="+knownHosts,
			"-o", "GlobalKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=30")
	}
	run := func(t *testing.T, stdin string, env []string, args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, sshBin, args...)
		cmd.Stdin = strings.NewReader(stdin)
		cmd.Env = append(os.Environ(), env...)
		return testutil.Run(t, cmd)
	}
	agent := func(t *testing.T, stdin, command string, extra ...string) (string, string, int) {
		t.Helper()
		return run(t, stdin, nil, append(sshArgs(agentKey, extra...), "agent@127.0.0.1", command)...)
	}

	// Refusals first: they need no VM, and the template builds meanwhile.
	t.Run("unknown key refused", func(t *testing.T) {
		_, se, code := run(t, "", nil, append(sshArgs(strangerKey), "agent@127.0.0.1", "true")...)
		// Only publickey is offered: no password or keyboard-interactive.
		if code != 255 || !strings.Contains(se, "Permission denied (publickey)") {
			t.Fatalf("code %d stderr %q", code, se)
		}
	})
	t.Run("a pinning client refuses another host key", func(t *testing.T) {
		other := filepath.Join(dir, "other_known_hosts")
		_, otherPub := sshClientKey(t, dir, "not_the_host_key")
		if err := os.WriteFile(other, []byte(hostField+" "+string(ssh.MarshalAuthorizedKey(otherPub))), 0o644); err != nil {
			t.Fatal(err)
		}
		_, se, code := run(t, "", nil, append(sshArgs(agentKey, "-o", "UserKnownHostsFile="+other), "agent@127.0.0.1", "true")...)
		if code != 255 || !strings.Contains(se, "Host key verification failed") {
			t.Fatalf("code %d stderr %q", code, se)
		}
	})
	t.Run("denied by policy", func(t *testing.T) {
		so, se, code := run(t, "", nil, append(sshArgs(narrowKey), "agent@127.0.0.1", "uname -a")...)
		if code != wire.ExitDenied || so != "" || !strings.Contains(se, "vmgate: denied by policy profile narrow: shell strings") {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})

	t.Run("uname", func(t *testing.T) {
		so, se, code := agent(t, "", "uname -a")
		if code != 0 || !strings.HasPrefix(so, "Linux vmgate ") {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("exit status", func(t *testing.T) {
		if _, se, code := agent(t, "", "exit 7"); code != 7 {
			t.Fatalf("code %d stderr %q", code, se)
		}
	})
	t.Run("stderr separate", func(t *testing.T) {
		so, se, code := agent(t, "", "echo out; echo err >&2; exit 3")
		if code != 3 || so != "out\n" || se != "err\n" {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("stdin piped through", func(t *testing.T) {
		so, se, code := agent(t, "hi\nthere\n", "cat")
		if code != 0 || so != "hi\nthere\n" {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("env by the profile's allowlist", func(t *testing.T) {
		so, se, code := run(t, "", []string{"GREETING=hello there", "SECRET=s3cret"},
			append(sshArgs(agentKey, "-o", "SendEnv=GREETING", "-o", "SendEnv=SECRET"), "agent@127.0.0.1", `echo "$GREETING/${SECRET-unset}"`)...)
		if code != 0 || so != "hello there/unset\n" {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("command and env bytes that are not UTF-8", func(t *testing.T) {
		so, se, code := run(t, "", []string{"GREETING=\xff\x80 \xfe"},
			append(sshArgs(agentKey, "-o", "SendEnv=GREETING"), "agent@127.0.0.1", "printf '%s|' '\xfd\xc3' \"$GREETING\"")...)
		if code != 0 || so != "\xfd\xc3|\xff\x80 \xfe|" {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("llama-server style", func(t *testing.T) {
		so, se, code := agent(t, "", "timeout 10s sh -c 'echo a; exit 3'")
		if code != 3 || so != "a\n" {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("killed by a signal", func(t *testing.T) {
		// exit-signal; OpenSSH's client then exits 255 (as with sshd).
		so, se, code := agent(t, "", "echo before; kill -KILL $$")
		if code != 255 || so != "before\n" {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("interactive", func(t *testing.T) {
		so, se, code := run(t, "echo $((6*7)); exit 5\n", nil, append(sshArgs(agentKey, "-tt"), "agent@127.0.0.1")...)
		// The terminal echoes the input line ("$((6*7))"); only the
		// shell's answer has 42, at the end of a line.
		if code != 5 || !strings.Contains(so, "42\r\n") {
			t.Fatalf("code %d stdout %q stderr %q", code, so, se)
		}
	})
	t.Run("terminal resized while running", func(t *testing.T) {
		// OpenSSH's client sends window-change only from a real terminal:
		// Go's client does it here, with the host key pinned as well.
		conn := sshDial(t, "127.0.0.1:"+strconv.Itoa(port), agentKey, pub)
		defer conn.Close()
		sess, err := conn.NewSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.Close()
		if err := sess.RequestPty("xterm", 30, 100, ssh.TerminalModes{}); err != nil {
			t.Fatal(err)
		}
		stdin, err := sess.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		out := &testutil.SyncBuffer{}
		first := out.Seen("30 100")
		sess.Stdout = out
		if err := sess.Start("stty size; read x; stty size"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-first:
		case <-time.After(3 * time.Minute):
			t.Fatalf("no first size: %q", out.String())
		}
		if err := sess.WindowChange(50, 132); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		_, _ = io.WriteString(stdin, "go\n")
		if err := sess.Wait(); err != nil || !strings.Contains(out.String(), "50 132") {
			t.Fatalf("%v; output %q", err, out.String())
		}
	})
	t.Run("idle interactive shell ended", func(t *testing.T) {
		// stdin stays open and silent: after the prompt, nothing happens.
		pr, pw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer pw.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, sshBin, append(sshArgs(briefKey, "-tt"), "agent@127.0.0.1")...)
		var so, se bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = pr, &so, &se
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pr.Close()
		err = cmd.Wait()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != wire.ExitTimedOut || !strings.Contains(se.String(), "sessions.idle_timeout") {
			t.Fatalf("%v; stdout %q stderr %q", err, so.String(), se.String())
		}
	})
	var goneReq string
	t.Run("client gone mid-command", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, sshBin, append(sshArgs(agentKey), "agent@127.0.0.1", "echo started; exec sleep 300")...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil || line != "started\n" {
			_ = cmd.Process.Kill()
			t.Fatalf("first line %q: %v", line, err)
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		_ = cmd.Wait()
		waitFor(t, time.Minute, "the VM of the dropped command to go", func() bool {
			st, err := d.Client.Status(context.Background())
			return err == nil && st.LiveVMs == 0
		})
		for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
			if r.Kind == audit.KindExec && len(r.Argv) == 3 && strings.Contains(r.Argv[2], "sleep 300") {
				goneReq = r.RequestID
				// Killed when the client went away: an error, never a
				// clean exit.
				if r.Error == "" || (r.ExitCode != nil && *r.ExitCode >= 0) {
					t.Errorf("dropped command audited as %+v", r)
				}
			}
		}
		if goneReq == "" {
			t.Error("no exec record for the dropped command")
		}
	})

	// llama-server's --tools-runtime ssh:TARGET sends every built-in tool
	// through ssh as one argument, each word single-quoted
	// (server-tools.cpp, common/subproc.cpp): replayed here exactly, on a
	// session login, so that what one call writes a later call reads.
	llama := func(t *testing.T, key, target, stdin, cwd, toolCmd string) (string, string, int) {
		t.Helper()
		words := []string{"timeout", "10s", "sh", "-c", toolCmd}
		if cwd != "" {
			words = append([]string{"sh", "-c", `cd "$1" || exit 127; shift; exec "$@"`, "_", cwd}, words...)
		}
		args := append(sshArgs(key, "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no"), target, llamaQuote(words))
		return run(t, stdin, nil, args...)
	}
	const session = "session-llama@127.0.0.1"
	t.Run("llama-server tools on a session login", func(t *testing.T) {
		steps := []struct {
			name, stdin, cwd, cmd, want string
			code                        int
		}{
			{"write_file", "hello world\nsecond line\n", "", `mkdir -p "$(dirname '/tmp/work/notes/a.txt')" && cat > '/tmp/work/notes/a.txt'`, "", 0},
			{"read_file", "", "", `cat -- '/tmp/work/notes/a.txt'`, "hello world\nsecond line\n", 0},
			{"edit_file (read)", "", "", `cat -- '/tmp/work/notes/a.txt'`, "hello world\nsecond line\n", 0},
			{"edit_file (write)", "hello there\nsecond line\n", "", `mkdir -p "$(dirname '/tmp/work/notes/a.txt')" && cat > '/tmp/work/notes/a.txt'`, "", 0},
			{"file_glob_search", "", "", `find '/tmp/work' -name '*.txt'`, "/tmp/work/notes/a.txt\n", 0},
			{"grep_search", "", "", `grep -rn 'there' '/tmp/work'`, "/tmp/work/notes/a.txt:1:hello there\n", 0},
			{"get_info uname", "", "", "uname -a", "Linux vmgate ", 0},
			{"cwd wrapper", "", "/tmp/work/notes", "cat a.txt; pwd", "hello there\nsecond line\n/tmp/work/notes\n", 0},
			{"cwd absent in the guest", "", "/home/someone/project", "pwd", "", 127},
			{"exec_shell_command writes state", "", "", "echo 'export X=1' > /tmp/work/env", "", 0},
			{"a later call reads it", "", "", ". /tmp/work/env; echo $X", "1\n", 0},
			{"timeout in the VM", "", "", "sleep 30", "", 124},
		}
		for _, st := range steps {
			so, se, code := llama(t, agentKey, session, st.stdin, st.cwd, st.cmd)
			if code != st.code || !strings.HasPrefix(so, st.want) || (st.want == "" && so != "") {
				t.Fatalf("%s: code %d stdout %q stderr %q; want code %d, stdout %q", st.name, code, so, se, st.code, st.want)
			}
		}
	})
	t.Run("a session login belongs to its key", func(t *testing.T) {
		// The same login with another key, and a plain login with the
		// same key, see a fresh VM: no file.
		if so, _, code := llama(t, briefKey, session, "", "", "cat /tmp/work/notes/a.txt"); code == 0 {
			t.Fatalf("another key read the session's file: %q", so)
		}
		if so, _, code := llama(t, agentKey, "agent@127.0.0.1", "", "", "cat /tmp/work/notes/a.txt"); code == 0 {
			t.Fatalf("a fresh-VM login read the session's file: %q", so)
		}
		_, se, code := run(t, "", nil, append(sshArgs(agentKey), "session-../x@127.0.0.1", "true")...)
		if code != wire.ExitDenied || !strings.Contains(se, "a session name is 1 to 64 of [A-Za-z0-9._-]") {
			t.Fatalf("a bad session name: code %d stderr %q", code, se)
		}
		if !strings.Contains(testutil.ReadFile(t, d.AuditPath), `"reason":"login \"session-../x\": a session name`) {
			t.Error("the refused login is not in the audit log")
		}
	})
	t.Run("a shell on a session login attaches to its VM", func(t *testing.T) {
		w := &testutil.SyncBuffer{}
		seen := w.Seen("hello there")
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, sshBin, append(sshArgs(agentKey, "-tt"), session)...)
		cmd.Stdin = strings.NewReader("cat /tmp/work/notes/a.txt; exit\n")
		cmd.Stdout, cmd.Stderr = w, w
		_ = cmd.Run()
		select {
		case <-seen:
		default:
			t.Fatalf("the shell did not see the session's file:\n%s", w.String())
		}
	})

	d.StopAndCheck(t)
	agentFP, narrowFP := ssh.FingerprintSHA256(agentPub), ssh.FingerprintSHA256(narrowPub)
	var execs, denials, interactive int
	for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
		if r.SSH == nil {
			continue
		}
		if r.UID != nil || !strings.HasPrefix(r.SSH.Remote, "127.0.0.1:") || (r.SSH.User != "agent" && !strings.HasPrefix(r.SSH.User, sshfront.SessionLoginPrefix)) {
			t.Errorf("SSH record %+v", r)
		}
		switch {
		case r.SSH.Fingerprint == agentFP && r.Kind == audit.KindExec && r.SSH.Comment == "agent@integ" && r.StdoutSHA256 != "":
			execs++
		case r.SSH.Fingerprint == narrowFP && r.Kind == audit.KindDecision && r.Verdict == audit.VerdictDeny:
			denials++
		}
		if r.Kind == audit.KindDecision && r.Message == "interactive shell" && r.Argv[0] == "bash" {
			interactive++
		}
	}
	if execs < 8 || denials != 1 || interactive != 3 {
		t.Fatalf("audit log: %d exec records with the agent key's fingerprint (want ≥ 8), %d denials of the narrow key (want 1), %d interactive shells (want 3)\n%s",
			execs, denials, interactive, testutil.ReadFile(t, d.AuditPath))
	}
	if _, err := audit.VerifyFile(d.AuditPath); err != nil {
		t.Fatal(err)
	}
}

// llamaQuote is llama-server's quoting of an ssh command line: every word
// in single quotes, a single quote written as '\”.
func llamaQuote(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
