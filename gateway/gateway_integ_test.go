package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

const testPolicy = `version = 1

[[profile]]
name = "test"
match = { any = true }
user = "root"
max_vms = 4
allow_shell = true
env = ["GREETING"]
output_limit = "1MiB"
[profile.timeout]
default = "60s"
max = "5m"
[profile.sessions]
allowed = true
idle_timeout = "5m"
max_lifetime = "30m"

[[profile.deny]]
name = "no-rm"
program = ["rm"]
`

// startDaemon runs the real gateway in-process on a socket in a temp dir,
// on testPolicy.
func startDaemon(t *testing.T, mutate func(*gateway.Config)) *gatewaytest.Daemon {
	t.Helper()
	return gatewaytest.Start(t, testPolicy, mutate)
}

func TestGateway_ExecPaths(t *testing.T) {
	d := startDaemon(t, nil)

	t.Run("uname", func(t *testing.T) {
		res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"uname", "-a"}}, nil)
		if res.ExitCode != 0 || !strings.HasPrefix(so, "Linux vmgate ") || res.VMID == "" || res.Profile != "test" {
			t.Fatalf("%+v %q", res, so)
		}
	})
	t.Run("exit code and env", func(t *testing.T) {
		res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{`echo "$GREETING"; exit 7`}, Shell: true, Env: []string{"GREETING=hi there"}}, nil)
		if res.ExitCode != 7 || so != "hi there\n" {
			t.Fatalf("%+v %q", res, so)
		}
	})
	t.Run("stdin streaming", func(t *testing.T) {
		data := make([]byte, 300<<10)
		_, _ = rand.Read(data)
		res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"sha256sum"}}, bytes.NewReader(data))
		if res.ExitCode != 0 || !strings.HasPrefix(so, sha256hex(data)) {
			t.Fatalf("%+v %q", res, so)
		}
	})
	t.Run("denied", func(t *testing.T) {
		_, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"rm", "-rf", "/"}}, nil)
		var ae *client.APIError
		if !errors.Is(err, client.ErrDenied) || !errors.As(err, &ae) || ae.Body.Rule == "" || ae.Status != http.StatusForbidden {
			t.Fatalf("got %v", err)
		}
		if !strings.Contains(err.Error(), "no-rm") {
			t.Errorf("denial does not name the rule: %v", err)
		}
		_, _, _, err = d.Exec(t, wire.ExecRequest{Argv: []string{"env"}, Env: []string{"SECRET=x"}}, nil)
		if !errors.Is(err, client.ErrDenied) {
			t.Fatalf("env outside the allowlist: %v", err)
		}
	})
	t.Run("malformed requests keep the daemon up", func(t *testing.T) {
		for name, body := range map[string]string{
			"not json":      "{nope",
			"unknown field": `{"argv":["true"],"evil":1}`,
			"empty argv":    `{"argv":[]}`,
			"nul":           "{\"argv\":[\"a\\u0000b\"]}",
			"bad base64":    `{"argv":[{"b64":"%%%"}]}`,
			"nul in base64": `{"argv":["printf",{"b64":"YQBi"}]}`,
			"nul in env":    `{"argv":["env"],"env":[{"b64":"Sz1hAGI="}]}`,
			"huge":          `{"argv":["` + strings.Repeat("a", 2<<20) + `"]}`,
			"trailing":      `{"argv":["true"]} {}`,
		} {
			status := rawPost(t, d.Socket, "/v1/exec", body, true)
			if status != http.StatusBadRequest {
				t.Errorf("%s: status %d, want 400", name, status)
			}
		}
		if status := rawPost(t, d.Socket, "/v1/exec", `{"argv":["true"]}`, false); status != http.StatusBadRequest {
			t.Errorf("no upgrade header: %d", status)
		}
		// An empty program is the policy's to refuse (201), with why.
		if _, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{""}}, nil); !errors.Is(err, client.ErrDenied) || !strings.Contains(err.Error(), "empty program") {
			t.Errorf("an empty program: %v", err)
		}
		if _, err := d.Client.Status(context.Background()); err != nil {
			t.Fatalf("daemon down after malformed requests: %v", err)
		}
	})
	t.Run("sessions", func(t *testing.T) {
		d.MustExec(t, wire.ExecRequest{Argv: []string{"echo state > /root/mark"}, Shell: true, Session: "s1"}, nil)
		_, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"cat", "/root/mark"}, Session: "s1"}, nil)
		if so != "state\n" {
			t.Fatalf("state lost within the session: %q", so)
		}
		_, so, _ = d.MustExec(t, wire.ExecRequest{Argv: []string{"tty; stty size"}, Shell: true, Session: "s1", TTY: &wire.TTY{Cols: 100, Rows: 30}}, nil)
		if !strings.HasPrefix(so, "/dev/pts/") || !strings.Contains(so, "30 100") {
			t.Fatalf("tty: %q", so)
		}
		ss, err := d.Client.Sessions(context.Background())
		if err != nil || len(ss) != 1 || ss[0].Name != "s1" {
			t.Fatalf("sessions: %v %v", ss, err)
		}
		// Another uid sees no session and cannot end ours.
		out, code := asNobody(t, d.Socket, "--list-sessions")
		if code != 0 || strings.TrimSpace(out) != "" {
			t.Fatalf("nobody lists sessions: code %d out %q", code, out)
		}
		if _, code := asNobody(t, d.Socket, "--end-session", "s1"); code == 0 {
			t.Fatal("another uid ended our session")
		}
		if err := d.Client.EndSession(context.Background(), "s1"); err != nil {
			t.Fatal(err)
		}
		if ss, _ := d.Client.Sessions(context.Background()); len(ss) != 0 {
			t.Fatalf("session still listed: %v", ss)
		}
		// A fresh VM has no state from the session.
		res, _, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"test", "-e", "/root/mark"}}, nil)
		if res.ExitCode != 1 {
			t.Fatalf("state leaked into a fresh VM: %+v", res)
		}
	})

	d.StopAndCheck(t)
	rep, err := audit.VerifyFile(d.AuditPath)
	if err != nil {
		t.Fatalf("audit chain: %v", err)
	}
	b, _ := os.ReadFile(d.AuditPath)
	log := string(b)
	for _, want := range []string{`"verdict":"deny"`, `"rule":"deny[0] no-rm"`, `"exit_code":7`, `"kind":"session"`, `"stdout_sha256"`,
		`new namespaces [user mnt pid net ipc uts cgroup]`, `no_new_privs=true; seccomp mode 2`} {
		if !strings.Contains(log, want) {
			t.Errorf("audit log lacks %s", want)
		}
	}
	t.Logf("audit: %d records", rep.Lines)
	// Tampering is detected.
	lines := strings.Split(strings.TrimSpace(log), "\n")
	lines[2] = strings.Replace(lines[2], `"uid":`, `"uid":1`, 1)
	tampered := filepath.Join(t.TempDir(), "t.jsonl")
	_ = os.WriteFile(tampered, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
	if _, err := audit.VerifyFile(tampered); !errors.Is(err, audit.ErrChainBroken) {
		t.Fatalf("tampered log verified: %v", err)
	}
}

func sha256hex(b []byte) string {
	return hexSum(b)
}

// rawPost sends a hand-made request and returns the status code.
func rawPost(t *testing.T, socket, path, body string, upgrade bool) int {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://x"+path, strings.NewReader(body))
	if upgrade {
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", wire.Upgrade)
	}
	// The daemon may answer (and close) before a huge body is sent: write
	// concurrently and judge by the answer.
	go func() { _ = req.Write(conn) }()
	resp, err := http.ReadResponse(bufioReader(conn), req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// asNobody runs the built vm-exec as uid/gid 65534.
func asNobody(t *testing.T, socket string, args ...string) (string, int) {
	t.Helper()
	testutil.RequiresRoot(t)
	bin := os.Getenv("VMGATE_TEST_BIN")
	if bin == "" {
		t.Skip("VMGATE_TEST_BIN not set")
	}
	cmd := exec.Command(testutil.ForOthers(t, filepath.Join(bin, "vm-exec")), append([]string{"--socket", socket}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	// The socket lives in 0700 test directories: let nobody through.
	_ = os.Chmod(filepath.Dir(socket), 0o755)
	_ = os.Chmod(filepath.Dir(filepath.Dir(socket)), 0o755)
	out, err := cmd.Output()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

// TestGateway_BusyAndDisconnect fills the only VM slot, checks the next
// request is refused as busy, then disconnects the first client and checks
// that its VM is destroyed.
func TestGateway_BusyAndDisconnect(t *testing.T) {
	d := startDaemon(t, func(c *gateway.Config) { c.MaxVMs = 1; c.QueueLen = -1 })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	var firstErr error
	started := &firstWrite{ch: make(chan struct{})}
	go func() {
		defer wg.Done()
		_, firstErr = d.Client.Exec(ctx, wire.ExecRequest{Argv: []string{"echo started; exec sleep 600"}, Shell: true}, client.ExecIO{Stdout: started})
	}()
	select {
	case <-started.ch:
	case <-time.After(3 * time.Minute):
		t.Fatal("the first command never started")
	}
	if n := len(vmDirs(d.Config.VM.StateDir)); n != 1 {
		t.Fatalf("%d VM directories, want 1", n)
	}
	_, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"true"}}, nil)
	if !errors.Is(err, client.ErrBusy) {
		t.Fatalf("second request: want busy, got %v", err)
	}
	cancel()
	wg.Wait()
	if firstErr == nil {
		t.Fatal("cancelled exec returned no error")
	}
	waitFor(t, 30*time.Second, "the VM of the disconnected client to go", func() bool { return len(vmDirs(d.Config.VM.StateDir)) == 0 })
	if out, err := exec.Command("pgrep", "-f", "qemu-system.*"+d.Config.VM.StateDir).Output(); err == nil {
		t.Fatalf("qemu still running: %s", out)
	}
}

// TestGateway_ReloadKeepsOldPolicyOnError reloads a new policy, then a
// broken one (SIGHUP's reload; the signal itself is TestServe_Acceptance's). The policies differ in a deny rule's name, so
// every probe is a denial and no VM boots.
func TestGateway_ReloadKeepsOldPolicyOnError(t *testing.T) {
	d := startDaemon(t, nil)
	ruleOf := func() string {
		_, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"rm", "x"}}, nil)
		var ae *client.APIError
		if !errors.As(err, &ae) {
			t.Fatalf("rm not denied: %v", err)
		}
		return ae.Body.Rule
	}
	if r := ruleOf(); r != "deny[0] no-rm" {
		t.Fatalf("initial rule %q", r)
	}
	if err := os.WriteFile(d.Config.PolicyPath, []byte(strings.Replace(testPolicy, `name = "no-rm"`, `name = "no-rm-v2"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Reload()
	if r := ruleOf(); r != "deny[0] no-rm-v2" {
		t.Fatalf("after the reload, rule %q", r)
	}
	if err := os.WriteFile(d.Config.PolicyPath, []byte("version = 1\nbogus = true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Reload()
	if r := ruleOf(); r != "deny[0] no-rm-v2" {
		t.Fatalf("after a broken reload the old policy should still apply, rule %q", r)
	}
	if _, err := d.Client.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	// A decision records the names (not the values) of the environment,
	// the working directory and the terminal a request asked for.
	_, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"rm", "y"}, Env: []string{"GREETING=s3cret"}, Dir: "/srv",
		TTY: &wire.TTY{Term: "xterm", Cols: 80, Rows: 24}}, nil)
	if !errors.Is(err, client.ErrDenied) {
		t.Fatalf("rm y: %v", err)
	}
	d.StopAndCheck(t)
	var found bool
	for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
		if r.Kind == audit.KindDecision && slices.Equal(r.Argv, []string{"rm", "y"}) {
			found = slices.Equal(r.EnvNames, []string{"GREETING"}) && r.Dir == "/srv" && r.TTY
		}
	}
	if !found || strings.Contains(testutil.ReadFile(t, d.AuditPath), "s3cret") {
		t.Errorf("the decision record lacks env names, dir or tty, or holds a value:\n%s", testutil.ReadFile(t, d.AuditPath))
	}
}

func TestGateway_RefusesBadStart(t *testing.T) {
	img := testutil.RequiresImage(t)
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.toml")
	_ = os.WriteFile(bad, []byte("version = 1\n[[profile]]\nname = \"x\"\nmatch = { any = true }\nbogus = 1\n"), 0o644)
	err := gateway.Run(context.Background(), gateway.Config{Socket: filepath.Join(dir, "s.sock"), VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: filepath.Join(dir, "st")}, ImageDir: img},
		PolicyPath: bad, PolicyExplicit: true, AllowRoot: true})
	if err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("invalid policy: %v", err)
	}
	if os.Geteuid() == 0 {
		err = gateway.Run(context.Background(), gateway.Config{Socket: filepath.Join(dir, "s.sock"), VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: filepath.Join(dir, "st")}, ImageDir: img}})
		if err == nil || !strings.Contains(err.Error(), "--allow-root") {
			t.Fatalf("root without --allow-root: %v", err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "s.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a refused start left a socket")
	}
}

func vmDirs(state string) []os.DirEntry {
	ents, _ := os.ReadDir(filepath.Join(state, "vms"))
	return ents
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// firstWrite closes ch on the first write.
type firstWrite struct {
	once sync.Once
	ch   chan struct{}
}

func (f *firstWrite) Write(p []byte) (int, error) {
	f.once.Do(func() { close(f.ch) })
	return len(p), nil
}

// TestGateway_SessionIdleExpiry checks that an idle session is ended and
// its VM destroyed.
//
// The same VM also shows that the policy's [isolate] seccomp reaches the
// jail: with "off" only QEMU's own filter is loaded (the audit record's jail
// report says 1 filter instead of 2).
func TestGateway_SessionIdleExpiry(t *testing.T) {
	short := filepath.Join(t.TempDir(), "short-idle.toml")
	pol := strings.Replace(testPolicy, `idle_timeout = "5m"`, `idle_timeout = "2s"`, 1) + "\n[isolate]\nseccomp = \"off\"\n"
	if err := os.WriteFile(short, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *gateway.Config) { c.PolicyPath = short })
	d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "short"}, nil)
	if ss, _ := d.Client.Sessions(context.Background()); len(ss) != 1 {
		t.Fatalf("session not created: %v", ss)
	}
	waitFor(t, 30*time.Second, "the idle session to end", func() bool {
		ss, _ := d.Client.Sessions(context.Background())
		return len(ss) == 0 && len(vmDirs(d.Config.VM.StateDir)) == 0
	})
	d.StopAndCheck(t)
	b, err := os.ReadFile(d.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "seccomp mode 2 with 1 filters") {
		t.Fatalf("isolate.seccomp = off did not reach the jail:\n%s", b)
	}
}

// TestGateway_SessionLifetime: a session's commands cannot outlive its
// max_lifetime: a command still running then is ended as timed out, and a
// chained command after it gets a new session (a new VM), whether the
// reaper or the use itself ended the old one.
func TestGateway_SessionLifetime(t *testing.T) {
	short := filepath.Join(t.TempDir(), "short-life.toml")
	pol := strings.Replace(strings.Replace(testPolicy, `idle_timeout = "5m"`, `idle_timeout = "8s"`, 1), `max_lifetime = "30m"`, `max_lifetime = "8s"`, 1)
	if err := os.WriteFile(short, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *gateway.Config) { c.PolicyPath = short })
	first, _, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "life"}, nil)
	t0 := time.Now()
	res, _, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"sleep", "60"}, Session: "life"}, nil)
	if !res.TimedOut || time.Since(t0) > 30*time.Second {
		t.Fatalf("a command past the session's lifetime: %+v after %v", res, time.Since(t0))
	}
	next, _, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "life"}, nil)
	if next.VMID == first.VMID {
		t.Fatalf("a chained command after the lifetime ran in the expired session's VM %s", next.VMID)
	}
	d.StopAndCheck(t)
	if !strings.Contains(testutil.ReadFile(t, d.AuditPath), `"message":"ended: expired`) {
		t.Error("no audit record of the session's end")
	}
}

// TestGateway_AuditFullFailsClosed puts the audit log on a tiny tmpfs: once
// it is full, every request is refused with audit_unavailable (no VM runs
// unaudited) and the daemon stays up.
func TestGateway_AuditFullFailsClosed(t *testing.T) {
	mnt := testutil.Tmpfs(t, "8k")
	d := startDaemon(t, func(c *gateway.Config) { c.AuditPath = filepath.Join(mnt, "audit.jsonl") })
	var last error
	for i := 0; i < 200; i++ {
		_, _, _, last = d.Exec(t, wire.ExecRequest{Argv: []string{"rm", strings.Repeat("x", 200)}}, nil)
		var ae *client.APIError
		if errors.As(last, &ae) && ae.Body.Code == wire.CodeAudit {
			break
		}
		if !errors.Is(last, client.ErrDenied) {
			t.Fatalf("request %d: %v", i, last)
		}
	}
	var ae *client.APIError
	if !errors.As(last, &ae) || ae.Body.Code != wire.CodeAudit || ae.Status != http.StatusServiceUnavailable {
		t.Fatalf("audit never reported full: %v", last)
	}
	if !strings.Contains(last.Error(), "no space left") {
		t.Errorf("error does not say why: %v", last)
	}
	// An allowed command is refused too, before any VM starts.
	_, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"true"}}, nil)
	if !errors.As(err, &ae) || ae.Body.Code != wire.CodeAudit {
		t.Fatalf("allowed command while audit is down: %v", err)
	}
	if n := len(vmDirs(d.Config.VM.StateDir)); n != 0 {
		t.Fatalf("%d VMs started while the audit log was down", n)
	}
	st, err := d.Client.Status(context.Background())
	if err != nil || !strings.Contains(st.Audit, "unavailable") {
		t.Fatalf("status: %v %v", st, err)
	}
	// The operator makes room: the daemon records again without a
	// restart, and the outage is in the log.
	if err := syscall.Mount("", mnt, "", syscall.MS_REMOUNT, "size=1m"); err != nil {
		t.Fatalf("remount: %v", err)
	}
	waitFor(t, 30*time.Second, "the audit log to recover", func() bool {
		st, err := d.Client.Status(context.Background())
		return err == nil && st.Audit == "ok"
	})
	if _, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"rm", "x"}}, nil); !errors.Is(err, client.ErrDenied) {
		t.Fatalf("after the recovery a request is decided again: %v", err)
	}
	d.StopAndCheck(t)
	rep, err := audit.VerifyFile(filepath.Join(mnt, "audit.jsonl"))
	if err != nil {
		t.Fatalf("what was written must still verify: %v", err)
	}
	recs := testutil.JSONLines[audit.Record](t, filepath.Join(mnt, "audit.jsonl"))
	var recovered bool
	for _, r := range recs {
		recovered = recovered || (r.Kind == audit.KindDaemon && strings.Contains(r.Message, "audit log recovered") && strings.Contains(r.Error, "no space left"))
	}
	if !recovered || recs[len(recs)-1].Seq != uint64(rep.Lines) {
		t.Fatalf("no recovery record in %d lines", rep.Lines)
	}
}

// TestGateway_FastPath runs commands on VMs restored from the shape's
// template: from the pool, then restored on demand, in a session, all
// audited with how the VM was made, and nothing left at shutdown.
func TestGateway_FastPath(t *testing.T) {
	d := startDaemon(t, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.Ahead, c.VM.TemplateDir = false, 1, 1, testutil.TemplateDir(t)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var pool wire.Pool
	waitPool := func() {
		for {
			st, err := d.Client.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Pools) == 1 {
				if pool = st.Pools[0]; pool.Ready >= 1 && pool.Ahead >= 1 {
					return
				}
			}
			select {
			case <-ctx.Done():
				t.Fatalf("pool never became ready: %v", st)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	waitPool()
	res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"sh", "-c", "echo fast; hostname"}}, nil)
	if res.ExitCode != 0 || so != "fast\nvmgate\n" || res.VMStart != "pool" {
		t.Fatalf("from the pool: %+v %q", res, so)
	}
	// Straight after, the pool may still be refilling: either way a fresh
	// restored VM, never the one just used.
	res2, _, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}}, nil)
	if res2.VMID == res.VMID || (res2.VMStart != "pool" && res2.VMStart != "restore") {
		t.Fatalf("second command: %+v (first %s)", res2, res.VMID)
	}
	waitPool()
	// The clone launched ahead when the pool was first full made the
	// second VM, or the pool's replacement of the first.
	if pool.AheadUsed < 1 || pool.AheadFailed != 0 {
		t.Fatalf("clones launched ahead: %v", pool)
	}
	res3, so3, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"sh", "-c", "echo kept > /root/f"}, Session: "s"}, nil)
	if res3.ExitCode != 0 || res3.VMStart != "pool" {
		t.Fatalf("session start: %+v %q", res3, so3)
	}
	res4, so4, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"cat", "/root/f"}, Session: "s"}, nil)
	if so4 != "kept\n" || res4.VMID != res3.VMID || res4.VMStart != "" {
		t.Fatalf("session reuse: %+v %q", res4, so4)
	}
	d.StopAndCheck(t)
	b, err := os.ReadFile(d.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"vm_start":"pool"`, `"vm_id":"` + res2.VMID + `"`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("audit log lacks %s", want)
		}
	}
}

// TestGateway_RestoreFailureFallsBack damages the template's state file
// under a running daemon: the next command still runs, on a cold-booted
// VM, the failure is logged with its reason, and the template is removed
// so that it gets rebuilt.
func TestGateway_RestoreFailureFallsBack(t *testing.T) {
	tdir := t.TempDir() // damaged below: never the shared templates
	var logs testutil.SyncBuffer
	d := startDaemon(t, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 0, tdir
		c.Log = slog.New(slog.NewTextHandler(io.MultiWriter(os.Stderr, &logs), &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	waitFor(t, 5*time.Minute, "the template", func() bool {
		st, err := d.Client.Status(ctx)
		return err == nil && len(st.Pools) == 1
	})
	res, _, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}}, nil)
	if res.VMStart != "restore" {
		t.Fatalf("with a good template: %+v", res)
	}
	states, _ := filepath.Glob(filepath.Join(tdir, "*", "state"))
	if len(states) != 1 {
		t.Fatalf("template state files: %v", states)
	}
	tmplDir := filepath.Dir(states[0])
	_ = os.Chmod(tmplDir, 0o700)
	if err := os.WriteFile(states[0], []byte("not a migration stream"), 0o400); err != nil {
		t.Fatal(err)
	}
	res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo", "still works"}}, nil)
	if res.ExitCode != 0 || so != "still works\n" || res.VMStart != "boot" {
		t.Fatalf("after the damage: %+v %q", res, so)
	}
	if l := logs.String(); !strings.Contains(l, "restore from template failed") {
		t.Errorf("the fallback was not logged:\n%s", l)
	}
	waitFor(t, time.Minute, "the damaged template to be removed", func() bool {
		_, err := os.Stat(tmplDir)
		return errors.Is(err, os.ErrNotExist)
	})
}

// TestGateway_Network runs web fetches from VMs through the daemon against
// a test internet in its own network namespace: the allowlisted name
// works with plain wget, everything else is refused, and every DNS query
// and connection is in the audit log.
func TestGateway_Network(t *testing.T) {
	inet := testutil.RequiresInternet(t)
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", r.Host)
	})
	for _, port := range []int{80, 8080} {
		ln := inet.Listen(t, port)
		go func() { _ = http.Serve(ln, hello) }()
	}
	tlsSrv := httptest.NewUnstartedServer(hello)
	tlsSrv.Listener = inet.Listen(t, 443)
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	pol := filepath.Join(t.TempDir(), "net.toml")
	text := strings.Replace(testPolicy, "[profile.sessions]", `[profile.network]
mode = "allowlist"
allow = ["allowed.test:80", "allowed.test:443", "private.test:80", "198.51.100.0/24:8080"]

[profile.sessions]`, 1)
	if err := os.WriteFile(pol, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *gateway.Config) {
		c.PolicyPath = pol
		c.NetHosts = map[string][]netip.Addr{
			"allowed.test": {inet.Addr}, "denied.test": {inet.Addr}, "private.test": {netip.MustParseAddr("10.9.8.7")},
		}
	})
	// The first command of a cold-booted VM: no waiting for the network
	// in the command, the daemon hands the VM out once it works.
	res, so, se := d.MustExec(t, wire.ExecRequest{Session: "web", Argv: []string{"wget", "-q", "-U", "Mozilla", "-O-", "http://allowed.test/"}}, nil)
	if res.ExitCode != 0 || so != "hello from allowed.test\n" || res.VMStart != "boot" {
		t.Fatalf("allowed fetch: %+v %q %q", res, so, se)
	}
	for name, cmd := range map[string]string{
		"https with the resolved name as SNI":  "curl -sSk https://allowed.test/",
		"direct address under an address rule": "curl -sS http://198.51.100.10:8080/",
	} {
		res, so, se := d.MustExec(t, wire.ExecRequest{Shell: true, Session: "web", Argv: []string{cmd}}, nil)
		if res.ExitCode != 0 || !strings.HasPrefix(so, "hello from ") {
			t.Errorf("%s: %+v %q %q", name, res, so, se)
		}
	}
	for name, cmd := range map[string]string{
		"name off the list":        "wget -q -T 5 -O- http://denied.test/",
		"private address":          "wget -q -T 5 -O- http://private.test/",
		"direct address":           "curl -sS -m 5 http://198.51.100.99/",
		"host mismatch":            "curl -sS -m 5 -H 'Host: other.test' http://allowed.test/",
		"gateway":                  "curl -sS -m 5 http://10.0.2.2:22/",
		"host loopback":            "curl -sS -m 5 http://127.0.0.1:22/",
		"sni mismatch":             "curl -sSk -m 5 --connect-to other.test:443:allowed.test:443 https://other.test/",
		"address rule, other port": "curl -sS -m 5 http://198.51.100.10:8081/",
	} {
		res, so, _ := d.MustExec(t, wire.ExecRequest{Shell: true, Session: "web", Argv: []string{cmd}}, nil)
		if res.ExitCode == 0 || strings.Contains(so, "hello") {
			t.Errorf("%s: %+v %q", name, res, so)
		}
	}
	// UDP goes nowhere but to the resolver; the datagram is recorded.
	d.MustExec(t, wire.ExecRequest{Shell: true, Session: "web", Argv: []string{"bash -c 'echo x > /dev/udp/198.51.100.10/9999'"}}, nil)
	// A guest that sends 100,000 refused datagrams: a burst of them is
	// recorded one by one, the rest in summary records.
	res, _, se = d.MustExec(t, wire.ExecRequest{Session: "web", Argv: []string{"python3", "-c",
		"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nfor i in range(100000): s.sendto(b'x', ('198.51.100.11', 9))"}}, nil)
	if res.ExitCode != 0 {
		t.Fatalf("udp flood: %+v %q", res, se)
	}
	floodReq := res.RequestID
	d.StopAndCheck(t)
	b, err := os.ReadFile(d.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"proto":"udp"`) || !strings.Contains(string(b), `"port":9999`) {
		t.Errorf("no audit record of the UDP datagram")
	}
	var allowed, denied int
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, `"kind":"net"`) {
			continue
		}
		if strings.Contains(line, `"verdict":"allow"`) {
			allowed++
		} else {
			denied++
		}
	}
	if allowed < 2 || denied < 4 { // DNS + connection allowed; several refusals
		t.Errorf("net audit records: %d allowed, %d denied\n%s", allowed, denied, b)
	}
	flood, summarised := 0, 0
	for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
		if r.Net != nil && r.Net.Addr == "198.51.100.11" {
			flood++
			// In a session, each command's network events are its own.
			if r.RequestID != floodReq {
				t.Errorf("a net record of the flood carries request %q, want %q", r.RequestID, floodReq)
			}
		}
		var n int
		if _, err := fmt.Sscanf(r.Message, "%d more refused network events", &n); err == nil {
			summarised += n
		}
	}
	if flood > 2000 || summarised == 0 {
		t.Errorf("udp flood: %d records one by one, %d in summaries", flood, summarised)
	}
	t.Logf("udp flood: %d records one by one, %d in summaries", flood, summarised)
}

// TestGateway_AuditFlood: a caller that no profile matches sends 1,000
// requests of 1 MiB of invalid UTF-8 each. The audit log grows by a few
// records of bounded size plus summaries that count the rest, another
// uid is still served, and the chain verifies.
func TestGateway_AuditFlood(t *testing.T) {
	testutil.RequiresRoot(t)
	d := gatewaytest.Start(t, `version = 1
[[profile]]
name = "nobody"
match = { uids = [65534] }
[[profile.allow]]
program = ["true"]
`, nil)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dl net.Dialer
		return dl.DialContext(ctx, "unix", d.Socket)
	}}}
	body := append(append([]byte(`{"argv":["`), bytes.Repeat([]byte{0xff}, 1<<20-20)...), `"]}`...)
	const n, conc = 1000, 4
	var wg sync.WaitGroup
	var denied atomic.Int32
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += conc {
				req, _ := http.NewRequest(http.MethodPost, "http://vmgate/v1/exec", bytes.NewReader(body))
				req.Header.Set("Upgrade", wire.Upgrade)
				resp, err := hc.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusForbidden {
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if denied.Load() != n {
		t.Fatalf("%d of %d flood requests denied", denied.Load(), n)
	}
	if so, code := asNobody(t, d.Socket, "true"); code != 0 {
		t.Fatalf("another uid is not served during the flood: exit %d %q", code, so)
	}
	d.StopAndCheck(t)
	st, err := os.Stat(d.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := audit.VerifyFile(d.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	one, summarised, nobody := 0, 0, false
	for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
		switch {
		case r.Kind == audit.KindDecision && r.UID != nil && *r.UID == 0 && r.Message == "":
			one++
		case r.UID != nil && *r.UID == 65534 && r.Verdict == audit.VerdictAllow:
			nobody = true
		}
		var k int
		if _, err := fmt.Sscanf(r.Message, "%d more denied requests", &k); err == nil {
			summarised += k
		}
	}
	t.Logf("audit log: %d bytes, %d lines; %d denials one by one, %d in summaries", st.Size(), rep.Lines, one, summarised)
	if st.Size() > 8<<20 || one+summarised != n || !nobody {
		t.Errorf("audit log of the flood: %d bytes, %d denials one by one + %d in summaries (want %d), other uid recorded: %v",
			st.Size(), one, summarised, n, nobody)
	}
}

// TestGateway_NetworkFastPath: VMs of profiles with a network come from
// their shape's template and pool like any other. Each gets the requesting
// profile's allowlist only when it is handed out, so a pooled VM never
// carries what another profile allows; the first and only command of a
// fresh VM reaches the allowed name; and the audit ties each connection to
// its request and VM.
func TestGateway_NetworkFastPath(t *testing.T) {
	inet := testutil.RequiresInternet(t)
	ln := inet.Listen(t, 80)
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", r.Host)
		}))
	}()
	pol := filepath.Join(t.TempDir(), "net.toml")
	text := `version = 1

[[profile]]
name = "web"
match = { uids = [0] }
user = "root"
max_vms = 4
[profile.network]
mode = "allowlist"
allow = ["allowed.test:80"]

[[profile]]
name = "narrow"
match = { uids = [65534] }
max_vms = 4
[profile.network]
mode = "allowlist"
allow = ["other.test:80"]
`
	if err := os.WriteFile(pol, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *gateway.Config) {
		c.PolicyPath, c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = pol, false, 1, testutil.TemplateDir(t)
		c.NetHosts = map[string][]netip.Addr{"allowed.test": {inet.Addr}, "other.test": {inet.Addr}}
	})
	wget := func(url string) (*wire.Result, string, string) {
		return d.MustExec(t, wire.ExecRequest{Argv: []string{"wget", "-q", "-T", "10", "-O-", url}}, nil)
	}
	// The first request of the shape boots cold or restores (the
	// template may be shared with other tests); either way its only
	// command reaches the allowed name at once.
	if res, so, se := wget("http://allowed.test/"); res.ExitCode != 0 || so != "hello from allowed.test\n" {
		t.Fatalf("first fetch: %+v %q %q", res, so, se)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	waitFor(t, 5*time.Minute, "the networked pool", func() bool {
		st, err := d.Client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range st.Pools {
			if p.Network && p.Ready >= 1 {
				return true
			}
		}
		return false
	})
	pooled, so, se := wget("http://allowed.test/")
	if pooled.ExitCode != 0 || so != "hello from allowed.test\n" || pooled.VMStart != "pool" {
		t.Fatalf("pooled fetch: %+v %q %q", pooled, so, se)
	}
	again, so, _ := wget("http://allowed.test/")
	if again.ExitCode != 0 || so != "hello from allowed.test\n" || (again.VMStart != "pool" && again.VMStart != "restore") {
		t.Fatalf("second fetch: %+v %q", again, so)
	}
	// Another profile's VMs come from the same pool with their own
	// allowlist: the name web may reach, narrow may not, and the other
	// way round.
	if out, code := asNobody(t, d.Socket, "wget", "-q", "-T", "5", "-O-", "http://allowed.test/"); code == 0 || strings.Contains(out, "hello") {
		t.Errorf("narrow profile reached web's name: %d %q", code, out)
	}
	if out, code := asNobody(t, d.Socket, "wget", "-q", "-T", "10", "-O-", "http://other.test/"); code != 0 || out != "hello from other.test\n" {
		t.Errorf("narrow profile's own name: %d %q", code, out)
	}
	if res, _, _ := wget("http://other.test/"); res.ExitCode == 0 {
		t.Errorf("web profile reached narrow's name: %+v", res)
	}
	st, err := d.Client.Status(ctx)
	if err != nil || st.RestoreHandshakeFailures != 0 {
		t.Errorf("status: %v %v", st.RestoreHandshakeFailures, err)
	}
	d.StopAndCheck(t)
	// The pooled VM's connection is audited as its request's, on its VM.
	b, err := os.ReadFile(d.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"kind":"net"`) && strings.Contains(line, `"proto":"tcp"`) && strings.Contains(line, pooled.RequestID) {
			found = true
			if !strings.Contains(line, `"vm_id":"`+pooled.VMID+`"`) || !strings.Contains(line, `"verdict":"allow"`) {
				t.Errorf("pooled VM's connection record: %s", line)
			}
		}
	}
	if !found {
		t.Errorf("no net record for the pooled request %s", pooled.RequestID)
	}
}

// TestGateway_ConnectionBounds: a kept-alive connection without a request
// is closed; one uid cannot hold more than its connections; and shutdown
// ends within the grace period with a client that stalls its request body
// and one that never reads the output of a running command.
func TestGateway_ConnectionBounds(t *testing.T) {
	dial := func(t *testing.T, d *gatewaytest.Daemon) net.Conn {
		c, err := net.Dial("unix", d.Socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	closedByServer := func(c net.Conn, within time.Duration) bool {
		_ = c.SetReadDeadline(time.Now().Add(within))
		_, err := c.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}
	t.Run("idle and per uid", func(t *testing.T) {
		d := startDaemon(t, func(c *gateway.Config) { c.MaxConnsPerUID, c.ConnIdle = 4, time.Second })
		idle := dial(t, d)
		if _, err := io.WriteString(idle, "GET /v1/status HTTP/1.1\r\nHost: vmgate\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(idle), nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("status: %v %v", resp, err)
		}
		resp.Body.Close()
		if !closedByServer(idle, 10*time.Second) {
			t.Error("an idle kept-alive connection was not closed")
		}
		// The idle one is gone (the server closed it): four more fit.
		var held []net.Conn
		for range 4 {
			held = append(held, dial(t, d))
		}
		// A fifth is answered busy and closed: its client says busy
		// (exit 202) instead of seeing its connection reset.
		over := dial(t, d)
		if _, err := io.WriteString(over, "GET /v1/status HTTP/1.1\r\nHost: vmgate\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err = http.ReadResponse(bufio.NewReader(over), nil)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("a fifth connection: %v %v", resp, err)
		}
		var e wire.Error
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || e.Code != wire.CodeBusy || !strings.Contains(e.Error, "connections open") {
			t.Errorf("a fifth connection's refusal: %+v %v", e, err)
		}
		resp.Body.Close()
		if !closedByServer(over, 5*time.Second) {
			t.Error("a fifth connection of the same uid was kept")
		}
		for _, c := range held {
			if closedByServer(c, 100*time.Millisecond) {
				t.Error("a connection within the bound was closed")
			}
		}
	})
	t.Run("shutdown within grace", func(t *testing.T) {
		d := startDaemon(t, nil)
		stalled := dial(t, d)
		if _, err := io.WriteString(stalled, "POST /v1/exec HTTP/1.1\r\nHost: vmgate\r\nUpgrade: "+wire.Upgrade+"\r\nConnection: Upgrade\r\nContent-Length: 1000\r\n\r\n{\"argv\":"); err != nil {
			t.Fatal(err)
		}
		deaf := dial(t, d)
		body := `{"argv":["yes"]}`
		if _, err := fmt.Fprintf(deaf, "POST /v1/exec HTTP/1.1\r\nHost: vmgate\r\nUpgrade: %s\r\nConnection: Upgrade\r\nContent-Length: %d\r\n\r\n%s", wire.Upgrade, len(body), body); err != nil {
			t.Fatal(err)
		}
		// It reads the switch to the exec stream, then nothing more.
		_ = deaf.SetReadDeadline(time.Now().Add(3 * time.Minute))
		resp, err := http.ReadResponse(bufio.NewReaderSize(deaf, 16), nil)
		if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("deaf client's exec: %v %v", resp, err)
		}
		time.Sleep(2 * time.Second) // "yes" fills the socket
		t0 := time.Now()
		d.StopAndCheck(t)
		took := time.Since(t0)
		t.Logf("shutdown with a stalled and a deaf client: %v (grace %v)", took.Round(time.Millisecond), d.Config.Grace)
		if took > d.Config.Grace+15*time.Second {
			t.Errorf("shutdown took %v with a grace of %v", took, d.Config.Grace)
		}
	})
}

// TestGateway_CallerFairness: with a profile's built-in per-caller share
// (half its VMs), a caller holding sessions cannot make another caller
// get busy; its own request beyond its share is the one refused.
func TestGateway_CallerFairness(t *testing.T) {
	fair := filepath.Join(t.TempDir(), "fair.toml")
	if err := os.WriteFile(fair, []byte(strings.Replace(testPolicy, "max_vms = 4", "max_vms = 2", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, func(c *gateway.Config) { c.PolicyPath = fair; c.QueueWait = 3 * time.Second })
	d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "one"}, nil)
	_, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"true"}, Session: "two"}, nil)
	if !errors.Is(err, client.ErrBusy) || !strings.Contains(err.Error(), "max_vms_per_caller = 1") {
		t.Fatalf("a second session beyond the caller's share: want busy naming the share, got %v", err)
	}
	if out, code := asNobody(t, d.Config.Socket, "echo", "served"); code != 0 || out != "served\n" {
		t.Fatalf("another caller, while the first holds its share: exit %d, output %q", code, out)
	}
	d.StopAndCheck(t)
}

// TestGateway_NamedImages: profile.image selects the image a VM boots
// (STATE/images/NAME), and a policy naming an image that is not built is
// refused at start and at reload, naming the profile and the image.
func TestGateway_NamedImages(t *testing.T) {
	img := testutil.RequiresImage(t)
	pol := func(image string) string {
		return strings.Replace(testPolicy, `user = "root"`, `user = "root"`+"\nimage = \""+image+"\"", 1)
	}
	// Refused at start.
	dir := t.TempDir()
	polPath := filepath.Join(dir, "p.toml")
	if err := os.WriteFile(polPath, []byte(pol("not-built")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := gateway.New(gateway.Config{Socket: filepath.Join(dir, "s.sock"), VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: filepath.Join(dir, "state")}, ImageDir: img, NoTemplate: true},
		AuditPath: filepath.Join(dir, "audit.jsonl"), PolicyPath: polPath, PolicyExplicit: true, AllowRoot: true})
	if err == nil || !strings.Contains(err.Error(), `profile "test": image "not-built"`) || !strings.Contains(err.Error(), "vmgated image build --name not-built") {
		t.Fatalf("a policy naming an image that is not built: %v", err)
	}

	// A named image: here a copy of the default one (hard links), which
	// a reload makes the profile's.
	d := startDaemon(t, nil)
	copyDir := filepath.Join(d.Config.VM.StateDir, "images", "copy")
	if err := os.MkdirAll(copyDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-al", img+"/.", copyDir).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v %s", err, out)
	}
	if err := os.WriteFile(d.Config.PolicyPath, []byte(pol("copy")), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Reload()
	res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo", "from the copy"}}, nil)
	if res.ExitCode != 0 || so != "from the copy\n" {
		t.Fatalf("exec on the named image: %+v %q", res, so)
	}
	// Its VMs boot from its own directory: without its disk, they fail,
	// and the record says which image.
	if err := os.Remove(filepath.Join(copyDir, "base.qcow2")); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"true"}}, nil); err == nil || !strings.Contains(err.Error(), "copy") {
		t.Fatalf("exec after the named image's disk was removed: %v", err)
	}
	// A reload onto a policy naming a missing image keeps the old one.
	if err := os.WriteFile(d.Config.PolicyPath, []byte(pol("gone")), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Reload()
	if _, _, _, err := d.Exec(t, wire.ExecRequest{Argv: []string{"true"}}, nil); err == nil || !strings.Contains(err.Error(), "copy") {
		t.Fatalf("after a refused reload the profile should still use image copy: %v", err)
	}
	d.StopAndCheck(t)
	log := testutil.ReadFile(t, d.AuditPath)
	if !strings.Contains(log, `"image":"copy"`) || !strings.Contains(log, `policy reload failed`) || !strings.Contains(log, `image \"gone\"`) {
		t.Errorf("audit log lacks the image name or the refused reload:\n%s", log)
	}
}
