package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

const servePolicy = `version = 1
[[profile]]
name = "cli"
match = { any = true }
allow_shell = true
max_vms = 4
[profile.timeout]
default = "2m"
max = "10m"
[[profile.deny]]
name = "no-rm"
program = ["rm"]
`

type served struct {
	notify *net.UnixConn // receives sd_notify messages
	cmd    *exec.Cmd
	socket string
	state  string
	audit  string
	policy string
	exited chan error
	reload chan string // the daemon's log lines about a policy reload

	logMu sync.Mutex
	log   []string // every line the daemon wrote to stderr
}

// logLines returns the daemon's stderr lines so far that contain s.
func (s *served) logLines(sub string) []string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	var out []string
	for _, l := range s.log {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return out
}

// startServe runs the built `vmgated serve` on servePolicy and waits
// until it accepts.
func startServe(t *testing.T, dir string) *served {
	t.Helper()
	return startServeWith(t, dir, servePolicy)
}

// startServeWith runs the built `vmgated serve` on policy and waits until
// it accepts.
func startServeWith(t *testing.T, dir, policy string) *served {
	t.Helper()
	img := testutil.RequiresImage(t)
	bin := binary(t, "vmgated")
	pol := filepath.Join(dir, "policy.toml")
	if err := os.WriteFile(pol, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &served{socket: filepath.Join(dir, "gw.sock"), state: filepath.Join(dir, "state"), audit: filepath.Join(dir, "audit.jsonl"), policy: pol, exited: make(chan error, 1), reload: make(chan string, 4)}
	s.cmd = exec.Command(bin, "serve", "--config", pol, "--socket", s.socket, "--state-dir", s.state, "--image", img,
		"--audit-log", s.audit, "--allow-root", "--grace", "2s", "--max-vms", "2", "--template-dir", testutil.TemplateDir(t))
	// Stand in for systemd's notification socket (a restart in the same
	// dir gets a new one).
	_ = os.Remove(filepath.Join(dir, "notify.sock"))
	ns, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "notify.sock"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	s.notify = ns
	s.cmd.Env = append(os.Environ(), "NOTIFY_SOCKET="+filepath.Join(dir, "notify.sock"))
	pr, err := s.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		once := false
		for sc.Scan() {
			s.logMu.Lock()
			s.log = append(s.log, sc.Text())
			s.logMu.Unlock()
			if !once && strings.Contains(sc.Text(), "vmgated ready") {
				once = true
				close(ready)
			}
			if strings.Contains(sc.Text(), "policy reload") {
				select { // never block the daemon's stderr
				case s.reload <- sc.Text():
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() { s.exited <- s.cmd.Wait() }()
	select {
	case <-ready:
	case err := <-s.exited:
		t.Fatalf("vmgated serve exited: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("vmgated serve not ready")
	}
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
	})
	return s
}

// notified waits for an sd_notify datagram containing want.
func (s *served) notified(t *testing.T, want string) {
	t.Helper()
	buf := make([]byte, 4096)
	_ = s.notify.SetReadDeadline(time.Now().Add(30 * time.Second))
	for {
		n, err := s.notify.Read(buf)
		if err != nil {
			t.Fatalf("no %s notification: %v", want, err)
		}
		if strings.Contains(string(buf[:n]), want) {
			return
		}
	}
}

func vmExec(t *testing.T, socket string, args ...string) (string, string, int) {
	t.Helper()
	return runCmd(t, append(os.Environ(), "VMGATE_SOCKET="+socket), binary(t, "vm-exec"), args...)
}

// TestServe_Acceptance is the acceptance list through the real
// binaries, then SIGTERM with a command running.
func TestServe_Acceptance(t *testing.T) {
	s := startServe(t, t.TempDir())
	s.notified(t, "READY=1")
	so, se, code := vmExec(t, s.socket, "uname", "-a")
	if code != 0 || !strings.HasPrefix(so, "Linux vmgate ") {
		t.Fatalf("uname: %d %q %q", code, so, se)
	}
	if _, se, code := vmExec(t, s.socket, "false"); code != 1 {
		t.Fatalf("false: %d %q", code, se)
	}
	if _, se, code := vmExec(t, s.socket, "sh", "-c", "exit 7"); code != 7 {
		t.Fatalf("sh -c 'exit 7': %d %q", code, se)
	}
	// 128+N with the guest's numbering, SIGXCPU (24) included.
	if _, se, code := vmExec(t, s.socket, "sh", "-c", "kill -XCPU $$"); code != 152 {
		t.Fatalf("killed by SIGXCPU: %d %q, want 152", code, se)
	}
	so, se, code = vmExec(t, s.socket, "--json", "-c", "echo out; echo err >&2; exit 3")
	var jr struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
		VMID     string `json:"vm_id"`
	}
	if err := json.Unmarshal([]byte(so), &jr); err != nil || code != 3 || jr.ExitCode != 3 || jr.Stdout != "out\n" || jr.Stderr != "err\n" || jr.VMID == "" {
		t.Fatalf("--json -c: code %d, %q (%v), stderr %q", code, so, err, se)
	}
	_, se, code = vmExec(t, s.socket, "rm", "-rf", "/")
	if code != 201 || !strings.Contains(se, "denied by policy") || !strings.Contains(se, "no-rm") {
		t.Fatalf("denied: %d %q", code, se)
	}
	// SIGHUP reloads the policy: the deny rule's new name is in force.
	if err := os.WriteFile(s.policy, []byte(strings.Replace(servePolicy, `"no-rm"`, `"no-rm-v2"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-s.reload:
		if !strings.Contains(line, "policy reloaded") {
			t.Fatalf("reload: %s", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no reload after SIGHUP")
	}
	if _, se, code = vmExec(t, s.socket, "rm", "x"); code != 201 || !strings.Contains(se, "no-rm-v2") {
		t.Fatalf("denied after reload: %d %q", code, se)
	}
	_, se, code = runCmd(t, append(os.Environ(), "VMGATE_SOCKET="+filepath.Join(t.TempDir(), "none.sock")), binary(t, "vm-exec"), "true")
	if code != 204 || !strings.Contains(se, "is vmgated running") {
		t.Fatalf("unreachable: %d %q", code, se)
	}

	// A command is running when SIGTERM arrives: after the grace period it
	// is killed, its VM destroyed, the socket removed, and the daemon exits 0.
	// The command says when it runs: the daemon's other VMs (its pool,
	// a clone launched ahead, a template being made) make a count of VM
	// directories say nothing about it.
	long := exec.Command(binary(t, "vm-exec"), "--socket", s.socket, "sh", "-c", "echo started; exec sleep 600")
	out, err := long.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("command: %q %v", line, err)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.exited:
		if err != nil {
			t.Fatalf("daemon exit after SIGTERM: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("daemon did not exit after SIGTERM")
	}
	s.notified(t, "STOPPING=1")
	if err := long.Wait(); err == nil {
		t.Error("the running command reported success after shutdown")
	}
	waitVMs(t, s.state, 0, 10*time.Second)
	if _, err := os.Stat(s.socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
	so, se, code = runCmd(t, nil, binary(t, "vmgated"), "audit", "verify", s.audit)
	if code != 0 || !strings.Contains(so, "chain intact") {
		t.Fatalf("audit verify: %d %q %q", code, so, se)
	}
}

// TestServe_RestartAfterKill kills the daemon with SIGKILL while a VM runs;
// the next start removes what it left.
// TestServe_FirstCommandRestores: with the templates made ahead
// (`vmgated image warm --config`, as make install does with the
// installed policy), the very first command after a daemon start runs in
// a VM restored from one, not a cold boot, in a profile with a network as
// in one without: warm makes every shape the policy names.
func TestServe_FirstCommandRestores(t *testing.T) {
	img := testutil.RequiresImage(t)
	dir := t.TempDir()
	netPolicy := strings.Replace(servePolicy, "[profile.timeout]", "[profile.network]\nmode = \"allowlist\"\nallow = [\"nothing.invalid:80\"]\n[profile.timeout]", 1)
	netPolicy = strings.Replace(netPolicy, "version = 1\n", "version = 1\n[[profile]]\nname = \"plain\"\nmatch = { uids = [4242] }\n", 1)
	pol := filepath.Join(dir, "warm.toml")
	if err := os.WriteFile(pol, []byte(netPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	so, se, code := runCmd(t, nil, binary(t, "vmgated"), "image", "warm", "--config", pol, "--image", img,
		"--state-dir", filepath.Join(dir, "state"), "--template-dir", testutil.TemplateDir(t))
	if code != 0 || !strings.Contains(so, "with a NIC") {
		t.Fatalf("image warm: %d %s %s", code, so, se)
	}
	s := startServeWith(t, dir, netPolicy)
	so, se, code = vmExec(t, s.socket, "--json", "uname", "-r")
	var jr struct {
		ExitCode int    `json:"exit_code"`
		VMStart  string `json:"vm_start"`
		BootMS   int64  `json:"boot_ms"`
	}
	if err := json.Unmarshal([]byte(so), &jr); err != nil || code != 0 || jr.ExitCode != 0 {
		t.Fatalf("first command: %d %q %q (%v)", code, so, se, err)
	}
	if jr.VMStart != "restore" && jr.VMStart != "pool" {
		t.Fatalf("the first command after the daemon started had a %q VM, want one restored from the template: %q", jr.VMStart, so)
	}
	t.Logf("first command of a networked profile: %s VM, got in %d ms", jr.VMStart, jr.BootMS)
}

// TestServe_RestartAfterKill: kill -9 of vmgated while a command runs in
// a VM with a network. The client reports the daemon gone (204). The next
// daemon start, before it accepts, removes all the killed one left (the
// VM directory with its overlay and sockets, the VM's cgroups, the socket
// file), finds none of the processes it ran (QEMU, the VM's netstack)
// alive, and logs what it removed.
func TestServe_RestartAfterKill(t *testing.T) {
	dir := t.TempDir()
	s := startServeWith(t, dir, sessionNetPolicy)
	// A shell pipeline ends its client early (| head): the same
	// caller's next command in the session still runs.
	loop := exec.Command("sh", "-c", `for i in $(seq 20); do vm-exec --session pipe seq 1 20000 | head -1 >/dev/null; vm-exec --session pipe true || echo BUSY $?; done`)
	loop.Env = append(os.Environ(), "VMGATE_SOCKET="+s.socket, "PATH="+filepath.Dir(binary(t, "vm-exec"))+":"+os.Getenv("PATH"))
	if out, err := loop.CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("a session after its pipeline's client died: %v %q", err, out)
	}
	// Its VM would hold one of the daemon's two slots.
	if _, se, code := vmExec(t, s.socket, "--end-session", "pipe"); code != 0 {
		t.Fatalf("--end-session pipe: %d %q", code, se)
	}
	// Sessions: p paused, r running when the daemon is killed.
	for _, args := range [][]string{{"--session", "p", "-c", "echo kept > ~/p"}, {"--session", "p", "--pause"}, {"--session", "r", "-c", "echo gone > ~/r"}} {
		if _, se, code := vmExec(t, s.socket, args...); code != 0 {
			t.Fatalf("%q: %d %q", args, code, se)
		}
	}
	// The command says when it runs: counting VM directories cannot tell
	// its VM from a template being made beside it. Its time limit
	// outlasts a slow boot, so the daemon is killed while it runs.
	long := exec.Command(binary(t, "vm-exec"), "--socket", s.socket, "--timeout", "10m", "sh", "-c", "echo started; exec sleep 600")
	var longErr testutil.SyncBuffer
	long.Stderr = &longErr
	out, err := long.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("command: %q %v; exit %v, stderr %q", line, err, long.Wait(), longErr.String())
	}
	// What the daemon runs now: its processes, and the command's VM with
	// its cgroups.
	procs := descendants(s.cmd.Process.Pid)
	st, err := client.New(s.socket).Status(context.Background())
	if err != nil || len(st.VMs) != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}
	vmID := st.VMs[0].VMID
	vmDir := filepath.Join(s.state, "vms", vmID)
	qemu, err := exec.Command("pgrep", "-f", "qemu-system.*"+vmDir).Output()
	if err != nil {
		t.Fatalf("no QEMU of %s: %v", vmDir, err)
	}
	procCgroup, _ := os.ReadFile("/proc/" + strings.Fields(string(qemu))[0] + "/cgroup")
	if len(testutil.CgroupDirsOf(string(procCgroup), vmID)) == 0 {
		t.Fatalf("no cgroup of VM %s in %q", vmID, procCgroup)
	}
	if len(procs) < 2 {
		t.Fatalf("daemon's processes %v, want at least QEMU and the netstack", procs)
	}

	_ = s.cmd.Process.Kill()
	<-s.exited
	var ee *exec.ExitError
	if err := long.Wait(); !errors.As(err, &ee) || ee.ExitCode() != wire.ExitUnreachable {
		t.Errorf("client of a killed daemon: %v, want exit %d", err, wire.ExitUnreachable)
	}
	if _, err := os.Stat(vmDir); err != nil {
		t.Fatalf("expected the killed daemon's VM directory to remain: %v", err)
	}
	if _, err := os.Stat(s.socket); err != nil {
		t.Fatalf("expected the killed daemon's socket file to remain: %v", err)
	}

	s2 := startServeWith(t, dir, sessionNetPolicy)
	// Ready means cleaned: the new daemon removes leftovers before it
	// accepts.
	if _, err := os.Stat(vmDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s left by the killed daemon: %v", vmDir, err)
	}
	if left := testutil.CgroupDirsOf(string(procCgroup), vmID); len(left) > 0 {
		t.Errorf("cgroups of the killed daemon's VM remain: %v", left)
	}
	for _, p := range procs {
		if p.alive() {
			t.Errorf("process %d (%s) of the killed daemon still runs", p.pid, p.cmd)
		}
	}
	for _, want := range []string{"removed leftover VM directory", "removed leftover VM group", "removed stale socket"} {
		lines := s2.logLines(want)
		if len(lines) == 0 || !strings.Contains(strings.Join(lines, "\n"), vmID) && want != "removed stale socket" {
			t.Errorf("the new daemon's log has no %q line naming %s: %q", want, vmID, lines)
		}
	}
	t.Logf("the new daemon's account: %q", append(s2.logLines("leftover"), s2.logLines("stale socket")...))
	if _, se, code := vmExec(t, s2.socket, "true"); code != 0 {
		t.Fatalf("after restart: %d %q", code, se)
	}
	// The paused session is still there; the running one was lost, which
	// its next command is told (205), once.
	if so, se, code := vmExec(t, s2.socket, "--session", "p", "-c", "cat ~/p"); code != 0 || so != "kept\n" {
		t.Errorf("a paused session after kill -9: %d %q %q", code, so, se)
	}
	if _, se, code := vmExec(t, s2.socket, "--session", "r", "-c", "cat ~/r"); code != wire.ExitVMFailed || !strings.Contains(se, "was lost") {
		t.Errorf("a session running at kill -9: %d %q", code, se)
	}
	if _, _, code := vmExec(t, s2.socket, "--session", "r", "-c", "cat ~/r"); code != 1 {
		t.Errorf("the next command on a lost session: %d, want a new session without the file (1)", code)
	}
	if len(s2.logLines("session lost")) != 1 { // r
		t.Errorf("the new daemon's log of lost sessions: %q", s2.logLines("session lost"))
	}
	_ = s2.cmd.Process.Signal(syscall.SIGTERM)
	<-s2.exited
}

// proc is a process, by pid and start time, so that a recycled pid is not
// taken for it.
type proc struct {
	pid   int
	start string
	cmd   string
}

func (p proc) alive() bool {
	q, ok := readProc(p.pid)
	return ok && q.start == p.start
}

// readProc reads a process's start time and command name from
// /proc/PID/stat.
func readProc(pid int) (proc, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return proc{}, false
	}
	// pid (comm) state ppid ... starttime is field 22; comm may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return proc{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || f[0] == "Z" {
		return proc{}, false
	}
	return proc{pid: pid, start: f[19], cmd: string(b[bytes.IndexByte(b, '(')+1 : i])}, true
}

// descendants lists the living processes below pid.
func descendants(pid int) []proc {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if f := strings.Fields(string(b[i+1:])); i > 0 && len(f) > 1 {
			ppid, _ := strconv.Atoi(f[1])
			children[ppid] = append(children[ppid], n)
		}
	}
	var out []proc
	queue := children[pid]
	for len(queue) > 0 {
		n := queue[0]
		queue = append(queue[1:], children[n]...)
		if p, ok := readProc(n); ok {
			out = append(out, p)
		}
	}
	return out
}

func readDir(p string) []os.DirEntry {
	e, _ := os.ReadDir(p)
	return e
}

func waitVMs(t *testing.T, state string, n int, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for len(readDir(filepath.Join(state, "vms"))) != n {
		select {
		case <-ctx.Done():
			t.Fatalf("want %d VM directories, have %d", n, len(readDir(filepath.Join(state, "vms"))))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestServe_SocketActivation starts vmgated the way systemd's .socket unit
// does, with the listening socket passed as fd 3 (LISTEN_FDS).
func TestServe_SocketActivation(t *testing.T) {
	img := testutil.RequiresImage(t)
	act, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI: systemd-socket-activate not installed (package systemd)")
		}
		t.Skip("systemd-socket-activate not installed")
	}
	dir := t.TempDir()
	sock := filepath.Join(dir, "act.sock")
	ignored := filepath.Join(dir, "ignored.sock")
	cmd := exec.Command(act, "-l", sock, binary(t, "vmgated"), "serve", "--builtin-policy", "--socket", ignored,
		"--state-dir", filepath.Join(dir, "state"), "--image", img, "--audit-log", filepath.Join(dir, "audit.jsonl"), "--allow-root", "--no-template")
	var logs testutil.SyncBuffer
	cmd.Stderr = &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		so, se, code := vmExec(t, sock, "--list-sessions")
		if code == 0 {
			if so != "" {
				t.Fatalf("unexpected sessions: %q", so)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("activated daemon never answered: %d %q\n%s", code, se, logs.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
	if _, err := os.Stat(ignored); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("daemon created its own socket despite activation: %v", err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	if !strings.Contains(logs.String(), "using the socket passed by systemd") {
		t.Fatalf("no activation in the log:\n%s", logs.String())
	}
}
