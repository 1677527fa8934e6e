package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/isolate/cgroup/cgrouptest"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/testutil"
)

func startTestVM(t *testing.T, state string) *VM {
	t.Helper()
	img := testutil.RequiresImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	opts := Options{Runtime: Runtime{StateDir: state, Accel: AccelAuto}, ImageDir: img}
	// As root a cgroup is always at hand (under CI its absence fails);
	// as a plain user the VM runs with rlimits only, as vmgated would.
	if os.Geteuid() == 0 {
		opts.Cgroups = cgrouptest.RequiresCgroups(t)
	}
	v, err := Start(ctx, opts)
	if err != nil {
		t.Fatalf("start vm: %v", err)
	}
	t.Logf("vm %s booted in %v (%s)", v.ID, v.BootDuration(), v.Accel)
	return v
}

type execOut struct {
	res            *ExecResult
	stdout, stderr string
}

func run(t *testing.T, v *VM, req ExecRequest) execOut {
	t.Helper()
	var so, se bytes.Buffer
	req.Stdout, req.Stderr = &so, &se
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := v.Exec(ctx, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return execOut{res, so.String(), se.String()}
}

func hashFile(t *testing.T, p string) [32]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}

// TestVM_Exec boots one VM and runs the exec behaviours against it.
func TestVM_Exec(t *testing.T) {
	img := testutil.RequiresImage(t)
	base := filepath.Join(img, "base.qcow2")
	before := hashFile(t, base)
	state := t.TempDir()
	v := startTestVM(t, state)

	t.Run("jailed", func(t *testing.T) {
		rep, err := v.JailReport()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("jail: %s", rep)
		for _, ns := range []string{"user", "mnt", "pid", "net", "ipc", "uts"} {
			if !slices.Contains(rep.NewNamespaces, ns) {
				t.Errorf("QEMU shares the %s namespace with the host", ns)
			}
		}
		zero := "0000000000000000"
		if rep.CapEff != zero || rep.CapPrm != zero || rep.CapBnd != zero || rep.CapAmb != zero {
			t.Errorf("QEMU holds capabilities: %s", rep)
		}
		if !rep.NoNewPrivs || rep.SeccompMode != 2 || rep.SeccompFilter < 2 {
			t.Errorf("want no_new_privs and our filter plus QEMU's: %s", rep)
		}
		if want := fmt.Sprintf("1000 %d 1", os.Getuid()); rep.UIDMap != want {
			t.Errorf("uid_map %q, want %q", rep.UIDMap, want)
		}
		// QEMU keeps transparent huge pages, under TCG too (JailSpec).
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", v.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		if want := "THP_enabled:\t1\n"; !strings.Contains(string(status), want) {
			t.Errorf("QEMU (%s) status lacks %q:\n%s", v.Accel, want, status)
		}
		// QEMU sees the image files it opens, not the rest of the image
		// directory; the /proc entries runc masks are masked; its files
		// are bounded.
		root := fmt.Sprintf("/proc/%d/root", v.Pid())
		abs, _ := filepath.Abs(img)
		if _, err := os.Stat(root + filepath.Join(abs, "manifest.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the jail shows the image's manifest: %v", err)
		}
		if _, err := os.Stat(root + filepath.Join(abs, "base.qcow2")); err != nil {
			t.Errorf("the jail lacks the base image: %v", err)
		}
		var null unix.Stat_t
		if err := unix.Stat("/dev/null", &null); err != nil {
			t.Fatal(err)
		}
		masked := 0
		for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list"} {
			if _, err := os.Stat(p); err != nil {
				continue // not in this kernel
			}
			var st unix.Stat_t
			if err := unix.Stat(root+p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != null.Rdev {
				t.Errorf("%s in the jail is not masked: %v (rdev %x)", p, err, st.Rdev)
			}
			masked++
		}
		if masked == 0 {
			t.Error("no masked /proc entry to check on this host")
		}
		if ents, err := os.ReadDir(root + "/proc/acpi"); err == nil && len(ents) != 0 {
			t.Errorf("/proc/acpi in the jail is not masked: %d entries", len(ents))
		}
		limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", v.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(limits), "\n") {
			if f := strings.Fields(line); strings.HasPrefix(line, "Max file size") && (len(f) < 5 || f[3] == "unlimited" || f[3] != f[4]) {
				t.Errorf("RLIMIT_FSIZE: %s", line)
			}
		}
	})
	t.Run("disk limit", func(t *testing.T) {
		im, err := loadImage(img)
		if err != nil {
			t.Fatal(err)
		}
		checkDiskLimit(t, v, im.diskMiB, DefaultDiskMiB)
	})
	t.Run("cgroup", func(t *testing.T) {
		if v.cgroup == nil {
			t.Skip("no cgroup manager (not root)")
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", v.Pid()))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), "/vm-"+v.ID+"\n"); n != len(v.cgroup.Dirs()) {
			t.Errorf("QEMU is in %d of its groups %v:\n%s", n, v.cgroup.Dirs(), b)
		}
		want := JailLimits(512, 1)
		if got := v.cgroup.Limits(); got != want {
			t.Errorf("limits %+v, want %+v", got, want)
		}
		for _, d := range v.cgroup.Dirs() {
			for f, w := range map[string]string{"pids.max": "256", "memory.max": fmt.Sprint(want.MemoryBytes), "memory.limit_in_bytes": fmt.Sprint(want.MemoryBytes)} {
				if got, err := os.ReadFile(filepath.Join(d, f)); err == nil && strings.TrimSpace(string(got)) != w {
					t.Errorf("%s/%s = %q, want %s", d, f, got, w)
				}
			}
		}
		t.Logf("usage: %v", v.cgroup.Stat())
	})
	t.Run("echo", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"echo", "hello", "world"}})
		if o.stdout != "hello world\n" || o.res.ExitCode != 0 || o.stderr != "" {
			t.Fatalf("got %+v stdout=%q stderr=%q", o.res, o.stdout, o.stderr)
		}
	})
	t.Run("exit after EOF does not wait out the kill grace", func(t *testing.T) {
		// The agent sends EOF before the exit record; the exit must not
		// then wait for a grace period meant for stuck output. With an
		// hour's grace, a regression hangs here until the test's deadline.
		for i := 0; i < 5; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			res, err := v.Exec(ctx, ExecRequest{Argv: []string{"true"}, KillGrace: time.Hour})
			cancel()
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("run %d: %+v, %v", i, res, err)
			}
		}
	})
	t.Run("exit codes", func(t *testing.T) {
		for _, code := range []string{"0", "1", "42"} {
			o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", "exit " + code}})
			if got := o.res.ExitCode; itoa(got) != code || o.res.Signal != "" {
				t.Errorf("exit %s: got %+v", code, o.res)
			}
		}
	})
	t.Run("not found", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"no-such-command-xyz"}})
		if o.res.ExitCode != 127 || !strings.Contains(o.stderr, "not found") {
			t.Fatalf("got %+v stderr=%q", o.res, o.stderr)
		}
	})
	t.Run("argv is not a shell string", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"echo", "$(id -u);", "`reboot`", "a b"}})
		if o.stdout != "$(id -u); `reboot` a b\n" {
			t.Fatalf("argv went through a shell: %q", o.stdout)
		}
	})
	t.Run("stdin 1MiB binary round trip", func(t *testing.T) {
		data := make([]byte, 1<<20)
		if _, err := rand.Read(data); err != nil {
			t.Fatal(err)
		}
		o := run(t, v, ExecRequest{Argv: []string{"cat"}, Stdin: bytes.NewReader(data)})
		if o.res.ExitCode != 0 || o.stdout != string(data) {
			t.Fatalf("round trip: exit %d, %d bytes back, equal=%v", o.res.ExitCode, len(o.stdout), o.stdout == string(data))
		}
	})
	t.Run("stderr separate", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
		if o.stdout != "out\n" || o.stderr != "err\n" || o.res.ExitCode != 3 {
			t.Fatalf("got stdout=%q stderr=%q %+v", o.stdout, o.stderr, o.res)
		}
	})
	t.Run("env and cwd", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", `echo "$FOO|$(pwd)"`}, Env: []string{"FOO=bar baz"}, Dir: "/etc"})
		if o.stdout != "bar baz|/etc\n" {
			t.Fatalf("got %q", o.stdout)
		}
	})
	t.Run("unprivileged user", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"id", "-un"}, User: "agent"})
		if o.stdout != "agent\n" {
			t.Fatalf("got %q stderr=%q", o.stdout, o.stderr)
		}
		o = run(t, v, ExecRequest{Argv: []string{"id", "-u"}})
		if o.stdout != "0\n" {
			t.Fatalf("default user: got %q", o.stdout)
		}
	})
	t.Run("pty", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", "tty; stty size"}, PTY: &PTY{Columns: 100, Rows: 30}})
		if !strings.HasPrefix(o.stdout, "/dev/pts/") || !strings.Contains(o.stdout, "30 100") {
			t.Fatalf("got %q %q", o.stdout, o.stderr)
		}
		o = run(t, v, ExecRequest{Argv: []string{"tty"}})
		if o.res.ExitCode == 0 {
			t.Fatalf("no pty requested but tty says %q", o.stdout)
		}
	})
	t.Run("pty resized while running", func(t *testing.T) {
		// The command prints its size, waits for a line, prints it again;
		// the new size is sent once the first one is out, then the line.
		stdinR, stdinW := io.Pipe()
		resize := make(chan PTY, 1)
		out := &testutil.SyncBuffer{}
		go func() {
			<-out.Seen("30 100")
			resize <- PTY{Columns: 132, Rows: 50}
			time.Sleep(500 * time.Millisecond)
			_, _ = io.WriteString(stdinW, "go\n")
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := v.Exec(ctx, ExecRequest{Argv: []string{"sh", "-c", "stty size; read x; stty size"}, PTY: &PTY{Columns: 100, Rows: 30},
			Stdin: stdinR, Stdout: out, Resize: resize})
		stdinW.Close()
		if err != nil || res.ExitCode != 0 || !strings.Contains(out.String(), "50 132") {
			t.Fatalf("res %+v err %v output %q", res, err, out.String())
		}
	})
	t.Run("guest clock set from host", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"date", "+%s"}})
		var guest int64
		for _, c := range strings.TrimSpace(o.stdout) {
			guest = guest*10 + int64(c-'0')
		}
		if d := time.Now().Unix() - guest; d < -5 || d > 30 {
			t.Fatalf("guest clock off by %ds (%q)", d, o.stdout)
		}
	})
	t.Run("signal", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}})
		if o.res.Signal != "TERM" || o.res.ShellExitCode() != 143 {
			t.Fatalf("got %+v", o.res)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		t0 := time.Now()
		o := run(t, v, ExecRequest{Argv: []string{"sleep", "100"}, Timeout: 2 * time.Second})
		if !o.res.TimedOut || o.res.Signal != "KILL" {
			t.Fatalf("got %+v", o.res)
		}
		if el := time.Since(t0); el > 60*time.Second {
			t.Fatalf("timeout took %v", el)
		}
		o = run(t, v, ExecRequest{Argv: []string{"sh", "-c", "pgrep -x sleep || echo none"}})
		if o.stdout != "none\n" {
			t.Fatalf("timed-out process still running: %q", o.stdout)
		}
	})
	t.Run("context cancel kills the command", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		_, err := v.Exec(ctx, ExecRequest{Argv: []string{"sleep", "100"}})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("want context.Canceled, got %v", err)
		}
		o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", "pgrep -x sleep || echo none"}})
		if o.stdout != "none\n" {
			t.Fatalf("cancelled process still running: %q", o.stdout)
		}
	})
	t.Run("output cap", func(t *testing.T) {
		var so bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := v.Exec(ctx, ExecRequest{Argv: []string{"timeout", "5", "yes"}, Stdout: &so, OutputLimit: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if so.Len() != 1<<20 || !res.StdoutTruncated || res.StdoutBytes <= 1<<20 || res.ExitCode != 124 {
			t.Fatalf("kept %d bytes, produced %d, truncated=%v exit=%d", so.Len(), res.StdoutBytes, res.StdoutTruncated, res.ExitCode)
		}
		t.Logf("yes produced %d MiB in 5s, kept 1 MiB", res.StdoutBytes>>20)
	})
	t.Run("write to disk stays in the overlay", func(t *testing.T) {
		o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", "dd if=/dev/urandom of=/root/blob bs=1M count=8 status=none && sync && echo ok"}})
		if o.stdout != "ok\n" {
			t.Fatalf("got %q %q", o.stdout, o.stderr)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		if _, err := v.Exec(context.Background(), ExecRequest{}); err == nil {
			t.Error("empty argv accepted")
		}
		if _, err := v.Exec(context.Background(), ExecRequest{Argv: []string{"echo", "a\x00b"}}); err == nil {
			t.Error("NUL in argv accepted")
		}
		if _, err := v.Exec(context.Background(), ExecRequest{Argv: []string{"id"}, User: "nobody-such"}); err == nil {
			t.Error("unknown user accepted")
		}
	})

	if err := v.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if v.cgroup != nil {
		for _, d := range v.cgroup.Dirs() {
			if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("cgroup %s left after close: %v", d, err)
			}
		}
	}
	if _, err := v.Exec(context.Background(), ExecRequest{Argv: []string{"true"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("exec after close: %v", err)
	}
	assertNoVMs(t, state)
	if after := hashFile(t, base); after != before {
		t.Fatal("base image changed")
	}
}

func assertNoVMs(t *testing.T, state string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(state, "vms"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		t.Fatalf("leftover VM directories: %v", ents)
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	neg := n < 0
	if neg {
		n = -n
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	if neg {
		b = append([]byte{'-'}, b...)
	}
	return string(b)
}

// TestVM_DiesMidExec kills QEMU the way a crashed daemon's successor does
// (CleanupStale: SIGKILL to the recorded pid) while a command runs.
func TestVM_DiesMidExec(t *testing.T) {
	state := t.TempDir()
	v := startTestVM(t, state)
	defer v.Close()
	errc := make(chan error, 1)
	go func() {
		_, err := v.Exec(context.Background(), ExecRequest{Argv: []string{"sleep", "100"}})
		errc <- err
	}()
	time.Sleep(time.Second)
	n, err := CleanupStale(state, nil)
	if err != nil || n != 1 {
		t.Fatalf("cleanup: n=%d err=%v", n, err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrVMDied) {
			t.Fatalf("want ErrVMDied, got %v", err)
		}
		t.Logf("exec error: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("exec did not notice the VM died")
	}
	if err := v.Close(); err != nil {
		t.Fatalf("close after death: %v", err)
	}
	assertNoVMs(t, state)
}

func TestCleanupStaleSparesUnrelatedPid(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "vms", "abc")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// Our own pid: alive, but not a QEMU of that directory.
	if err := os.WriteFile(filepath.Join(dir, PidFile), []byte(itoa(os.Getpid())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	n, err := CleanupStale(state, nil)
	if err != nil || n != 1 {
		t.Fatalf("n=%d err=%v", n, err)
	}
	assertNoVMs(t, state)
}

func TestStartRejectsBadImage(t *testing.T) {
	img := testutil.RequiresImage(t)
	state := t.TempDir()
	ctx := context.Background()

	if _, err := Start(ctx, Options{Runtime: Runtime{StateDir: state, Accel: AccelTCG}, ImageDir: filepath.Join(state, "none")}); err == nil || !strings.Contains(err.Error(), "image build") {
		t.Fatalf("missing image: %v", err)
	}
	// A copy of the image with a corrupt base and one without a kernel.
	corrupt := filepath.Join(state, "corrupt")
	copyImage(t, img, corrupt, "base.qcow2")
	size := fileSize(t, filepath.Join(img, "base.qcow2"))
	if err := os.WriteFile(filepath.Join(corrupt, "base.qcow2"), bytes.Repeat([]byte{0}, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(corrupt, "base.qcow2"), size); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ctx, Options{Runtime: Runtime{StateDir: state, Accel: AccelTCG}, ImageDir: corrupt}); err == nil || !strings.Contains(err.Error(), "not a qcow2") {
		t.Fatalf("corrupt base: %v", err)
	}
	nokernel := filepath.Join(state, "nokernel")
	copyImage(t, img, nokernel, "vmlinuz")
	if _, err := Start(ctx, Options{Runtime: Runtime{StateDir: state, Accel: AccelTCG}, ImageDir: nokernel}); err == nil || !strings.Contains(err.Error(), "vmlinuz") {
		t.Fatalf("missing kernel: %v", err)
	}
	assertNoVMs(t, state)
}

// copyImage symlinks every file of src into dst except skip.
func copyImage(t *testing.T, src, dst, skip string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == skip {
			continue
		}
		if err := os.Symlink(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
}

func fileSize(t *testing.T, p string) int64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// TestProbeBootTCG boots the image's kernel and initramfs in probe mode: the
// path the KVM probe uses, exercised under TCG.
func TestProbeBootTCG(t *testing.T) {
	img := testutil.RequiresImage(t)
	err := ProbeBoot(context.Background(), AccelTCG, "qemu-system-x86_64", filepath.Join(img, "vmlinuz"), filepath.Join(img, "initrd.img"), 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
}

func TestResolveAccel(t *testing.T) {
	a, err := ResolveAccel(context.Background(), AccelTCG, "", "", "", "", nil)
	if err != nil || a != AccelTCG {
		t.Fatalf("tcg: %v %v", a, err)
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		if _, err := ResolveAccel(context.Background(), AccelKVM, "", "", "", "", nil); err == nil {
			t.Fatal("kvm accepted without /dev/kvm")
		}
		t0 := time.Now()
		a, err := ResolveAccel(context.Background(), AccelAuto, "qemu-system-x86_64", "/nonexistent", "/nonexistent", "", nil)
		if err != nil || a != AccelTCG {
			t.Fatalf("auto without kvm: %v %v", a, err)
		}
		if time.Since(t0) > 5*time.Second {
			t.Fatal("auto probe without /dev/kvm was slow")
		}
	}
}

// TestStartTimeoutSaysWhatTheGuestDoes gives a cold boot less time than
// it needs: the error reports, for the host's log, what the host saw of
// the guest (run state, vCPU, APIC timer, QEMU's CPU time), and nothing
// is left behind.
func TestStartTimeoutSaysWhatTheGuestDoes(t *testing.T) {
	img := testutil.RequiresImage(t)
	state := t.TempDir()
	_, err := Start(context.Background(), Options{Runtime: Runtime{StateDir: state, Accel: AccelAuto}, ImageDir: img, BootTimeout: 4 * time.Second})
	var ve *Error
	if !errors.As(err, &ve) || ve.Phase != "boot" {
		t.Fatalf("want a boot *Error, got %v", err)
	}
	for _, want := range []string{"run state running", "agent port closed by the guest, host connected", "vCPU 0 at RIP ", "APIC LVTT ", "QEMU used "} {
		if !strings.Contains(ve.Guest, want) {
			t.Errorf("guest %q lacks %q", ve.Guest, want)
		}
	}
	if !strings.Contains(Details(err), "guest: "+ve.Guest) {
		t.Errorf("details lack the guest: %s", Details(err))
	}
	if strings.Contains(err.Error(), ve.Guest) {
		t.Errorf("the client's text carries the guest's state: %v", err)
	}
	t.Logf("%s", Details(err))
	assertNoVMs(t, state)
}
