//go:build linux && cgo

package seccomp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

func init() {
	children["syscalls"] = childSyscalls
	children["kill"] = childKill
	children["exec"] = childExec
	children["serving"] = childServing
}

// childSyscalls installs the TCG filter, checks denied and allowed calls,
// prints one line per check, and finally execs /bin/true: execve must stay
// allowed for the jail's exec of QEMU, so the exit status of /bin/true is
// the last check.
func childSyscalls() int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := Install(Options{Accel: "tcg", DefaultAction: "errno"}, log); err != nil {
		fmt.Printf("FAIL install: %v\n", err)
		return 1
	}
	check := func(name string, err, want error) {
		if errors.Is(err, want) || (want == nil && err == nil) {
			fmt.Printf("PASS %s: %v\n", name, err)
		} else {
			fmt.Printf("FAIL %s: got %v, want %v\n", name, err, want)
		}
	}
	for _, d := range []struct {
		name   string
		domain int
	}{{"AF_INET", unix.AF_INET}, {"AF_INET6", unix.AF_INET6}, {"AF_NETLINK", unix.AF_NETLINK}, {"AF_PACKET", unix.AF_PACKET}, {"AF_VSOCK", unix.AF_VSOCK}} {
		fd, err := unix.Socket(d.domain, unix.SOCK_STREAM, 0)
		if err == nil {
			unix.Close(fd)
		}
		check("socket "+d.name, err, unix.EPERM)
	}
	check("unshare CLONE_NEWUSER", unix.Unshare(unix.CLONE_NEWUSER), unix.EPERM)
	check("mount", unix.Mount("none", "/tmp", "tmpfs", 0, ""), unix.EPERM)
	_, _, e := unix.Syscall(unix.SYS_PTRACE, unix.PTRACE_TRACEME, 0, 0)
	check("ptrace", errnoErr(e), unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, 1, 0, 0)
	check("io_uring_setup", errnoErr(e), unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
	check("clone3", errnoErr(e), unix.ENOSYS)
	_, _, e = unix.Syscall(unix.SYS_IOCTL, 0, unix.TIOCGWINSZ, 0)
	check("ioctl (tcg)", errnoErr(e), unix.EPERM)
	_, _, e = unix.Syscall(unix.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(unix.SIGCHLD), 0, 0)
	check("clone CLONE_NEWUSER", errnoErr(e), unix.EPERM)

	// Allowed calls still work.
	if pid := unix.Getpid(); pid == os.Getpid() && pid > 0 {
		fmt.Println("PASS getpid")
	} else {
		fmt.Println("FAIL getpid")
	}
	var p [2]int
	err := unix.Pipe2(p[:], unix.O_CLOEXEC)
	check("pipe2", err, nil)
	if err == nil {
		_, werr := unix.Write(p[1], []byte("ping"))
		buf := make([]byte, 4)
		n, rerr := unix.Read(p[0], buf)
		check("pipe write+read", errors.Join(werr, rerr, boolErr(n == 4 && string(buf) == "ping")), nil)
	}
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	check("socketpair AF_UNIX", err, nil)
	if err == nil {
		_, werr := unix.Write(sp[0], []byte("pong"))
		buf := make([]byte, 4)
		n, rerr := unix.Read(sp[1], buf)
		check("socketpair write+read", errors.Join(werr, rerr, boolErr(n == 4 && string(buf) == "pong")), nil)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	check("socket AF_UNIX", err, nil)
	if err == nil {
		unix.Close(fd)
	}
	fmt.Println("EXEC /bin/true")
	err = unix.Exec("/bin/true", []string{"true"}, nil)
	fmt.Printf("FAIL execve: %v\n", err)
	return 1
}

// childKill installs the filter with the kill default and makes a denied
// call: the kernel must kill the process with SIGSYS.
func childKill() int {
	if err := Install(Options{Accel: "tcg", DefaultAction: "kill"}, slog.New(slog.DiscardHandler)); err != nil {
		fmt.Printf("FAIL install: %v\n", err)
		return 1
	}
	fmt.Println("INSTALLED")
	_, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	fmt.Printf("FAIL socket AF_INET survived: %v\n", err)
	return 1
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func boolErr(ok bool) error {
	if ok {
		return nil
	}
	return errors.New("data mismatch")
}

// runChild runs the test binary as child role name.
func runChild(t *testing.T, ctx context.Context, name string, extraEnv ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(extraEnv, childEnv+"="+name)...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	return cmd, &out
}

func TestInstall_Subprocess(t *testing.T) {
	t.Run("errno", func(t *testing.T) {
		cmd, out := runChild(t, t.Context(), "syscalls")
		err := cmd.Run()
		t.Logf("child output:\n%s", out)
		if err != nil {
			t.Fatalf("child: %v (execve of /bin/true must succeed and exit 0)", err)
		}
		if strings.Contains(out.String(), "FAIL") {
			t.Error("a check failed in the filtered child")
		}
		if n := strings.Count(out.String(), "PASS"); n < 18 {
			t.Errorf("%d checks passed, want 18", n)
		}
		if !strings.Contains(out.String(), "SECCOMP WARNING: execve allowed") {
			t.Error("Install did not log its SECCOMP WARNINGs")
		}
	})
	t.Run("kill", func(t *testing.T) {
		cmd, out := runChild(t, t.Context(), "kill")
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("child: %v, want death by SIGSYS\n%s", err, out)
		}
		ws := ee.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGSYS || !strings.Contains(out.String(), "INSTALLED") {
			t.Fatalf("child ended with %v, want SIGSYS after install\n%s", ws, out)
		}
	})
}

// childServing loads the netstack's second filter as the netstack does
// after its start-up, then checks that exec and every way to make a
// process fail while new threads still start.
func childServing() int {
	if err := Install(Options{Program: "netstack-serving"}, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Printf("FAIL install: %v\n", err)
		return 1
	}
	check := func(name string, err, want error) {
		if errors.Is(err, want) {
			fmt.Printf("PASS %s: %v\n", name, err)
		} else {
			fmt.Printf("FAIL %s: got %v, want %v\n", name, err, want)
		}
	}
	check("execve", unix.Exec("/bin/true", []string{"true"}, nil), unix.EPERM)
	// A null path: without the filter the kernel answers EFAULT.
	cwd := unix.AT_FDCWD
	_, _, e := unix.Syscall6(unix.SYS_EXECVEAT, uintptr(cwd), 0, 0, 0, 0, 0)
	check("execveat", errnoErr(e), unix.EPERM)
	_, _, e = unix.RawSyscall(unix.SYS_FORK, 0, 0, 0)
	check("fork", errnoErr(e), unix.EPERM)
	_, _, e = unix.RawSyscall(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0)
	check("clone without CLONE_THREAD", errnoErr(e), unix.EPERM)
	_, _, e = unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0)
	check("clone3", errnoErr(e), unix.ENOSYS)
	// os/exec: Go's clone(CLONE_VFORK|CLONE_VM), then exec.
	check("os/exec", exec.Command("/bin/true").Run(), unix.EPERM)

	// Threads: goroutines locked to their threads while they wait make
	// the runtime start a thread for each (glibc's pthread_create under
	// cgo: clone3, ENOSYS, then clone with CLONE_THREAD). A thread the
	// runtime cannot make is fatal, so getting here is half the check.
	threads := func() int {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			return -1
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "Threads:"); ok {
				n, _ := strconv.Atoi(strings.TrimSpace(v))
				return n
			}
		}
		return -1
	}
	// Each locked goroutine holds a thread of its own, the main goroutine
	// runs on another and sysmon on a third: with more goroutines than
	// there were threads, at least k+2 threads exist, all but "before"
	// of them started under the filter.
	before := threads()
	k := before + 4
	started, release := make(chan struct{}), make(chan struct{})
	for range k {
		go func() {
			runtime.LockOSThread()
			started <- struct{}{}
			<-release
		}()
	}
	for range k {
		<-started
	}
	if after := threads(); after >= k+2 && before > 0 {
		fmt.Printf("PASS threads: %d before, %d with %d goroutines locked to theirs\n", before, after, k)
	} else {
		fmt.Printf("FAIL threads: %d before, %d with %d goroutines locked to theirs\n", before, after, k)
	}
	close(release)
	return 0
}

// TestInstall_NetstackServing loads the netstack's second filter in a
// child: exec and fork fail, threads still start.
func TestInstall_NetstackServing(t *testing.T) {
	cmd, out := runChild(t, t.Context(), "serving")
	err := cmd.Run()
	t.Logf("child output:\n%s", out)
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	if strings.Contains(out.String(), "FAIL") {
		t.Error("a check failed in the filtered child")
	}
	if n := strings.Count(out.String(), "PASS"); n != 7 {
		t.Errorf("%d checks passed, want 7", n)
	}
}

// childExec installs the filter described by VMGATE_SECCOMP_TEST_OPTS and
// execs the argv in VMGATE_SECCOMP_TEST_ARGV, as the jail's last step does.
func childExec() int {
	var opts Options
	var argv []string
	if err := json.Unmarshal([]byte(os.Getenv("VMGATE_SECCOMP_TEST_OPTS")), &opts); err != nil {
		fmt.Fprintln(os.Stderr, "opts:", err)
		return 2
	}
	if err := json.Unmarshal([]byte(os.Getenv("VMGATE_SECCOMP_TEST_ARGV")), &argv); err != nil || len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "argv:", err)
		return 2
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	env := []string{"PATH=/usr/bin:/bin"}
	if err := Install(opts, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	err = unix.Exec(path, argv, env)
	fmt.Fprintln(os.Stderr, "exec:", err)
	return 1
}

// qemuUnderFilter starts QEMU with argv through the exec child.
func qemuUnderFilter(t *testing.T, ctx context.Context, opts Options, argv []string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	o, _ := json.Marshal(opts)
	a, _ := json.Marshal(argv)
	return runChild(t, ctx, "exec", "VMGATE_SECCOMP_TEST_OPTS="+string(o), "VMGATE_SECCOMP_TEST_ARGV="+string(a))
}

const sandboxArg = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

func baseArgv(img, dir, append string) []string { return baseArgvMachine(img, dir, append, "") }

func baseArgvMachine(img, dir, append, machineExtra string) []string {
	if khz := hostTSCkHz(); khz > 0 {
		append += " tsc_early_khz=" + strconv.Itoa(khz)
	}
	return []string{
		"qemu-system-x86_64", "-nodefaults", "-no-user-config", "-nographic",
		"-machine", "microvm,accel=tcg,rtc=on" + machineExtra, "-cpu", "max", "-m", "512", "-smp", "1",
		"-kernel", filepath.Join(img, "vmlinuz"), "-initrd", filepath.Join(img, "initrd.img"),
		"-append", append, "-no-reboot", "-serial", "file:" + filepath.Join(dir, "console.log"),
		"-sandbox", sandboxArg,
	}
}

// hostTSCkHz mirrors vm.HostTSCkHz (TCG boots hang under load without
// tsc_early_khz: see vm.HostTSCkHz); it is copied to keep this package's tests free
// of the vm package.
func hostTSCkHz() int {
	if v, err := strconv.Atoi(os.Getenv("VMGATE_TSC_KHZ")); err == nil && v > 0 {
		return v
	}
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
			return v
		}
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "cpu MHz" {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return 0
			}
			return int(f*1000 + 0.5)
		}
	}
	return 0
}

// TestInstall_QEMUProbe_Isolated boots the guest kernel in probe mode (no
// disk) with QEMU under the TCG filter: QEMU must exit 0 after the guest
// prints "vmgate-init: probe ok".
func TestInstall_QEMUProbe_Isolated(t *testing.T) {
	img := testutil.RequiresImage(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	argv := baseArgv(img, dir, "console=ttyS0 reboot=t panic=-1 vmgate.probe=1")
	cmd, out := qemuUnderFilter(t, ctx, Options{Accel: "tcg", DefaultAction: "errno"}, argv)
	err := cmd.Run()
	console, _ := os.ReadFile(filepath.Join(dir, "console.log"))
	if err != nil {
		t.Fatalf("qemu under the filter: %v\noutput:\n%s\nconsole tail:\n%s", err, out, tail(string(console), 2000))
	}
	if !strings.Contains(string(console), "vmgate-init: probe ok") {
		t.Fatalf("console lacks \"vmgate-init: probe ok\":\n%s", tail(string(console), 2000))
	}
}

// TestInstall_QEMUBoot_Isolated boots the full guest from a qcow2 overlay
// with the agent's virtio-serial socket, QMP and a -netdev stream NIC,
// under the kill-by-default TCG filter with Network set: a syscall outside
// the allowlist would kill QEMU. It waits for the guest agent's SSH banner
// on the agent socket, drives QMP (query-status, stop, cont) and quits.
func TestInstall_QEMUBoot_Isolated(t *testing.T) {
	img := testutil.RequiresImage(t)
	dir := t.TempDir()
	overlay := filepath.Join(dir, "overlay.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2",
		"-b", filepath.Join(img, "base.qcow2"), overlay).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	agentSock, qmpSock, netSock := filepath.Join(dir, "agent.sock"), filepath.Join(dir, "qmp.sock"), filepath.Join(dir, "net.sock")
	argv := append(baseArgv(img, dir, "console=ttyS0 reboot=t panic=-1 quiet loglevel=4 root=/dev/vda rw rootfstype=ext4"),
		"-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-device,rng=rng0",
		"-drive", "id=root,file="+overlay+",format=qcow2,if=none,discard=unmap",
		"-device", "virtio-blk-device,drive=root",
		"-chardev", "socket,id=agent,path="+agentSock+",server=on,wait=off",
		"-device", "virtio-serial-device,max_ports=2", "-device", "virtserialport,chardev=agent,name=vmgate.agent",
		"-qmp", "unix:"+qmpSock+",server=on,wait=off",
		"-netdev", "stream,id=n0,server=off,addr.type=unix,addr.path="+netSock,
		"-device", "virtio-net-device,netdev=n0")
	// Stand-in for vmgated's user-space network: accept the NIC's stream.
	nl, err := net.Listen("unix", netSock)
	if err != nil {
		t.Fatal(err)
	}
	defer nl.Close()
	netConn := make(chan net.Conn, 1)
	go func() {
		if c, err := nl.Accept(); err == nil {
			netConn <- c
		}
	}()
	cmd, out := qemuUnderFilter(t, ctx, Options{Accel: "tcg", Network: true, DefaultAction: "kill"}, argv)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-done
	}()
	fail := func(format string, args ...any) {
		t.Helper()
		console, _ := os.ReadFile(filepath.Join(dir, "console.log"))
		t.Fatalf(format+"\nqemu output:\n%s\nconsole tail:\n%s", append(args, out, tail(string(console), 3000))...)
	}

	qmp, err := dialQMP(ctx, qmpSock, done)
	if err != nil {
		fail("qmp: %v", err)
	}
	defer qmp.Close()
	banner, err := agentBanner(ctx, agentSock, done)
	if err != nil {
		fail("agent: %v", err)
	}
	t.Logf("agent banner: %q", banner)
	select {
	case c := <-netConn:
		defer c.Close()
	case <-time.After(10 * time.Second):
		fail("the NIC never connected to the -netdev stream socket")
	}
	for _, c := range []string{"query-status", "stop", "cont", "query-status"} {
		if r, err := qmp.cmd(c); err != nil {
			fail("qmp %s: %v", c, err)
		} else {
			t.Logf("qmp %s: %s", c, r)
		}
	}
	if _, err := qmp.cmd("quit"); err != nil {
		fail("qmp quit: %v", err)
	}
	select {
	case err := <-done:
		done <- err
		if err != nil {
			fail("qemu exit after quit: %v", err)
		}
	case <-ctx.Done():
		fail("qemu did not exit after quit")
	}
}

// agentBanner sends the guest agent the host's hello on its socket (QEMU
// listens there from its start) and returns the agent's version from its
// answer, which comes once the guest has booted to user space: proof that
// the virtio-serial path works under the filter.
func agentBanner(ctx context.Context, path string, done chan error) (string, error) {
	c, err := net.DialTimeout("unix", path, 10*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	hello, _ := agentproto.Hello{Protocol: agentproto.Protocol}.MarshalBinary()
	if _, err := c.Write(agentproto.AppendFrame(nil, agentproto.FrameHello, 0, hello)); err != nil {
		return "", err
	}
	type answer struct {
		r   agentproto.HelloReply
		err error
	}
	got := make(chan answer, 1)
	go func() {
		var buf []byte
		f, err := agentproto.ReadFrame(c, &buf, agentproto.MaxGuestPayload)
		var a answer
		switch {
		case err != nil:
			a.err = err
		case f.Type != agentproto.FrameHello:
			a.err = fmt.Errorf("a %v frame instead of the hello", f.Type)
		default:
			a.err = a.r.UnmarshalBinary(f.Payload)
		}
		got <- a
	}()
	select {
	case a := <-got:
		if a.err != nil {
			return "", a.err
		}
		return "vmgate-agent " + a.r.AgentVersion, nil
	case err := <-done:
		done <- err
		return "", fmt.Errorf("qemu exited: %v", err)
	}
}

type qmpConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialQMP(ctx context.Context, path string, done chan error) (*qmpConn, error) {
	for {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			q := &qmpConn{c: c, r: bufio.NewReader(c)}
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			if _, err := q.r.ReadString('\n'); err != nil { // greeting
				c.Close()
				return nil, err
			}
			if _, err := q.cmd("qmp_capabilities"); err != nil {
				c.Close()
				return nil, err
			}
			return q, nil
		}
		select {
		case err := <-done:
			done <- err
			return nil, fmt.Errorf("qemu exited: %v", err)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (q *qmpConn) cmd(name string) (string, error) { return q.cmdArgs(name, nil) }

// cmdArgs runs a QMP command with arguments, passing fds (SCM_RIGHTS) with
// it when given (for getfd).
func (q *qmpConn) cmdArgs(name string, args any, fds ...int) (string, error) {
	_ = q.c.SetDeadline(time.Now().Add(30 * time.Second))
	msg := map[string]any{"execute": name}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return "", err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := q.c.(*net.UnixConn).WriteMsgUnix(append(b, '\n'), oob, nil); err != nil {
		return "", err
	}
	for {
		line, err := q.r.ReadString('\n')
		if err != nil {
			return "", err
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			return "", err
		}
		if _, ok := m["error"]; ok {
			return "", fmt.Errorf("%s", strings.TrimSpace(line))
		}
		if _, ok := m["return"]; ok {
			return strings.TrimSpace(line), nil
		}
	}
}

func (q *qmpConn) Close() error { return q.c.Close() }

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestInstall_QEMUMigrate_Isolated covers the fast path's migration under
// the kill-by-default filter: a paused probe-mode VM with file-backed
// shared RAM saves its state to a file fd (getfd + migrate fd:, with
// x-ignore-shared), and a second QEMU (Incoming) restores it from an
// inherited fd (-incoming defer + migrate-incoming fd:3) over a private
// copy-on-write mapping of the same RAM file, continues, and boots the
// probe to "vmgate-init: probe ok" and exit 0.
func TestInstall_QEMUMigrate_Isolated(t *testing.T) {
	img := testutil.RequiresImage(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ram := filepath.Join(dir, "ram")
	vmArgv := func(share, qmp string) []string {
		return append(baseArgvMachine(img, dir, "console=ttyS0 reboot=t panic=-1 vmgate.probe=1", ",memory-backend=mem"),
			"-object", "memory-backend-file,id=mem,size=512M,mem-path="+ram+",share="+share,
			"-qmp", "unix:"+filepath.Join(dir, qmp)+",server=on,wait=off")
	}
	ignoreShared := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}

	// Save.
	saveCmd, saveOut := qemuUnderFilter(t, ctx, Options{Accel: "tcg", DefaultAction: "kill"}, append(vmArgv("on", "qmp-save.sock"), "-S"))
	if err := saveCmd.Start(); err != nil {
		t.Fatal(err)
	}
	saveDone := make(chan error, 1)
	go func() { saveDone <- saveCmd.Wait() }()
	defer func() { _ = saveCmd.Process.Kill(); <-saveDone }()
	q, err := dialQMP(ctx, filepath.Join(dir, "qmp-save.sock"), saveDone)
	if err != nil {
		t.Fatalf("save qmp: %v\n%s", err, saveOut)
	}
	state := filepath.Join(dir, "state.mig")
	sf, err := os.OpenFile(state, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		args any
		fds  []int
	}{
		{"migrate-set-capabilities", ignoreShared, nil},
		{"getfd", map[string]any{"fdname": "mig"}, []int{int(sf.Fd())}},
		{"migrate", map[string]any{"uri": "fd:mig"}, nil},
	}
	for _, s := range steps {
		if _, err := q.cmdArgs(s.name, s.args, s.fds...); err != nil {
			t.Fatalf("save %s: %v\n%s", s.name, err, saveOut)
		}
	}
	sf.Close()
	if err := waitQMP(ctx, q, "query-migrate", `"status": "completed"`); err != nil {
		t.Fatalf("save: %v\n%s", err, saveOut)
	}
	if _, err := q.cmd("quit"); err != nil {
		t.Fatalf("save quit: %v", err)
	}
	q.Close()
	if err := <-saveDone; err != nil {
		t.Fatalf("saving qemu exit: %v\n%s", err, saveOut)
	}
	saveDone <- nil

	// Restore from an inherited fd.
	rf, err := os.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	resCmd, resOut := qemuUnderFilter(t, ctx, Options{Accel: "tcg", Incoming: true, DefaultAction: "kill"},
		append(vmArgv("off", "qmp-restore.sock"), "-incoming", "defer"))
	resCmd.ExtraFiles = []*os.File{rf} // fd 3
	if err := resCmd.Start(); err != nil {
		t.Fatal(err)
	}
	resDone := make(chan error, 1)
	go func() { resDone <- resCmd.Wait() }()
	defer func() { _ = resCmd.Process.Kill(); <-resDone }()
	q, err = dialQMP(ctx, filepath.Join(dir, "qmp-restore.sock"), resDone)
	if err != nil {
		t.Fatalf("restore qmp: %v\n%s", err, resOut)
	}
	defer q.Close()
	for _, s := range steps[:1] {
		if _, err := q.cmdArgs(s.name, s.args); err != nil {
			t.Fatalf("restore %s: %v\n%s", s.name, err, resOut)
		}
	}
	if _, err := q.cmdArgs("migrate-incoming", map[string]any{"uri": "fd:3"}); err != nil {
		t.Fatalf("migrate-incoming: %v\n%s", err, resOut)
	}
	// The source never ran (-S), so the restored VM lands in prelaunch;
	// a template stopped after running lands in paused.
	if err := waitQMP(ctx, q, "query-status", `"status": "paused"`, `"status": "prelaunch"`); err != nil {
		t.Fatalf("restore: %v\n%s", err, resOut)
	}
	if _, err := q.cmd("cont"); err != nil {
		t.Fatalf("cont: %v\n%s", err, resOut)
	}
	select {
	case err := <-resDone:
		resDone <- err
		console, _ := os.ReadFile(filepath.Join(dir, "console.log"))
		if err != nil {
			t.Fatalf("restored qemu: %v\n%s\nconsole:\n%s", err, resOut, tail(string(console), 2000))
		}
		if !strings.Contains(string(console), "vmgate-init: probe ok") {
			t.Fatalf("restored VM did not finish the probe:\n%s", tail(string(console), 2000))
		}
	case <-ctx.Done():
		t.Fatal("restored qemu did not exit")
	}
}

// waitQMP polls a query command until its reply contains one of wants.
func waitQMP(ctx context.Context, q *qmpConn, query string, wants ...string) error {
	for {
		r, err := q.cmd(query)
		if err != nil {
			return fmt.Errorf("%s: %w", query, err)
		}
		for _, w := range wants {
			if strings.Contains(r, w) {
				return nil
			}
		}
		if strings.Contains(r, `"failed"`) {
			return fmt.Errorf("%s: %s", query, r)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: last reply %s: %w", query, r, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
