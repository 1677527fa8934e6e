package isolate_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/isolate/cgroup/cgrouptest"

	"github.com/vmgate/vmgate/internal/reexec"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/isolate"
	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/isolate/escapeprobe/attempts"
	"github.com/vmgate/vmgate/vm"
)

// escapeRunner runs as an unprivileged host user (as vmgated does) and
// starts the jail from there: args are the spec file, then the delegated
// cgroup directories it first moves itself into (as systemd starts a
// Delegate=yes service in its own cgroup). From there it takes a cgroup for
// the jail exactly as the daemon does.
func escapeRunner(args []string) error {
	b, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var spec isolate.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return err
	}
	for _, d := range args[1:] {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return fmt.Errorf("join delegated cgroup: %w", err)
		}
	}
	m, err := cgroup.Open(cgroup.GroupName(filepath.Dir(args[0])), nil)
	if err != nil {
		return err
	}
	defer m.Close()
	g, err := m.New("escape", vm.JailLimits(escapeMemMiB, 1))
	if err != nil {
		return err
	}
	defer g.Remove()
	fmt.Printf("runner: jail cgroup %v with %+v in %s\n", g.Dirs(), g.Limits(), m)
	j, err := isolate.Command(spec)
	if err != nil {
		return err
	}
	j.Cmd.Stdout, j.Cmd.Stderr = os.Stdout, os.Stderr
	if err := j.Start(g); err != nil {
		return err
	}
	err = j.Cmd.Wait()
	fmt.Printf("runner: jail cgroup usage %v\n", g.Stat())
	return err
}

// escapeMemMiB is the guest memory the probe's jail is sized for.
const escapeMemMiB = 512

func init() { reexec.Register("escape-runner", escapeRunner) }

func TestMain(m *testing.M) {
	reexec.MaybeRunChild()
	os.Exit(m.Run())
}

// buildProbe compiles the static escape probe.
func buildProbe(t *testing.T) string {
	t.Helper()
	return testutil.BuildStatic(t, "github.com/vmgate/vmgate/isolate/escapeprobe", "")
}

// TestEscape_Isolated runs the escape probe in place of QEMU in exactly the
// jail a VM gets (same spec builder, same seccomp filter) and requires every
// attempt to be blocked.
const nobody = 65534

func TestEscape_Isolated(t *testing.T) {
	// The jail runs as nobody: the image must be reachable for it.
	img := testutil.ForOthers(t, testutil.RequiresImage(t))
	// The jail's cgroup comes from a group delegated to the unprivileged
	// daemon user, as systemd's Delegate=yes gives vmgated one.
	cgm := cgrouptest.RequiresCgroups(t)
	delegated, undelegate, err := cgm.Delegate("service", nobody, nobody)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := undelegate(); err != nil {
			t.Errorf("remove delegated cgroup: %v", err)
		}
	}()
	probe := buildProbe(t)
	// The daemon's own files live apart from the VM directories, as in
	// /var/lib/vmgate; the jail runs as an unprivileged host user (nobody),
	// as vmgated does.
	hostDir := t.TempDir()
	host := t.TempDir()
	for _, d := range []string{host, filepath.Dir(host), filepath.Dir(probe), filepath.Dir(filepath.Dir(probe))} {
		_ = os.Chmod(d, 0o755)
	}
	secret := filepath.Join(hostDir, "daemon-secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(host, "vms", "othervm")
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "overlay.qcow2"), []byte("other VM"), 0o600); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(host, "vms", "thisvm")
	if err := os.MkdirAll(mine, 0o700); err != nil {
		t.Fatal(err)
	}
	// The daemon user owns the VM directories (0700).
	for _, d := range []string{mine, filepath.Dir(mine)} {
		if err := os.Chown(d, nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	sockPath := filepath.Join(host, "host.sock")
	ln, err := net.Listen("unix", sockPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()

	qemuArgv := []string{"qemu-system-x86_64", "-nodefaults"}
	spec, err := vm.JailSpec(qemuArgv, mine, []string{img}, vm.AccelTCG, escapeMemMiB)
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("VMGATE_TEST_JAIL_SECCOMP") == "off" { // for debugging the jail's other layers
		spec.Seccomp = "off"
	}
	report := filepath.Join(mine, "escape.json")
	spec.ReadOnly = append(spec.ReadOnly, probe)
	spec.Argv = []string{probe, "--out", report, "--host-file", secret, "--host-file", "/etc/shadow",
		"--host-dir", hostDir, "--other-vm-dir", other, "--host-socket", sockPath,
		"--host-pid", strconv.Itoa(os.Getpid()), "--writable-dir", mine, "--no-kvm"}
	// Run this test binary as nobody in the runner role, which builds the
	// jail exactly as vmgated would as its own unprivileged user.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runner := filepath.Join(filepath.Dir(probe), "isolate.test")
	if b, err := os.ReadFile(self); err != nil || os.WriteFile(runner, b, 0o755) != nil {
		t.Fatalf("copy test binary: %v", err)
	}
	specFile := filepath.Join(filepath.Dir(probe), "spec.json")
	sb, _ := json.Marshal(spec)
	if err := os.WriteFile(specFile, sb, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(runner, append([]string{specFile}, delegated...)...)
	cmd.Env = []string{reexec.ChildEnv + "=escape-runner"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := runWithContext(ctx, cmd)
	t.Logf("probe output:\n%s", out)
	if err != nil {
		t.Fatalf("probe in jail: %v", err)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatalf("no report: %v", err)
	}
	var rep attempts.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("attempt → result\n%s", attempts.Table(rep))
	for _, r := range rep.Failures() {
		if r.Control {
			t.Errorf("control %s failed: %s", r.Name, r.Detail)
		} else {
			t.Errorf("ESCAPE: %s succeeded: %s", r.Name, r.Detail)
		}
	}
	n := 0
	for _, r := range rep.Results {
		if r.Blocked && !r.Control && !r.Skipped {
			n++
		}
	}
	if n < 25 {
		t.Fatalf("only %d blocked attempts, want ≥ 25", n)
	}
	if b, _ := os.ReadFile(secret); string(b) != "host secret" {
		t.Fatal("host file changed")
	}
}

func runWithContext(ctx context.Context, cmd *exec.Cmd) (string, error) {
	var out testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return out.String(), ctx.Err()
	}
}

// TestEscape_CapsDroppedEveryTime starts the jail many times and checks
// that the program never holds a capability or lacks no_new_privs. Both
// are per thread: the jail once exec'd the program from a thread other
// than the one that dropped them, which one run in a few caught.
func TestEscape_CapsDroppedEveryTime(t *testing.T) {
	img := testutil.RequiresImage(t)
	testutil.RequiresRoot(t)
	probe := buildProbe(t)
	dir := t.TempDir()
	spec, err := vm.JailSpec([]string{"qemu-system-x86_64"}, dir, []string{img}, vm.AccelTCG, escapeMemMiB)
	if err != nil {
		t.Fatal(err)
	}
	spec.ReadOnly = append(spec.ReadOnly, probe)
	report := filepath.Join(dir, "r.json")
	spec.Argv = []string{probe, "--out", report, "--only", "capeff-zero", "--only", "no-new-privs"}
	for i := 0; i < 25; i++ {
		j, err := isolate.Command(spec)
		if err != nil {
			t.Fatal(err)
		}
		var out testutil.SyncBuffer
		j.Cmd.Stdout, j.Cmd.Stderr = &out, &out
		if err := j.Start(nil); err != nil {
			t.Fatal(err)
		}
		if err := j.Cmd.Wait(); err != nil {
			t.Fatalf("run %d: %v\n%s", i, err, out.String())
		}
		b, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		var rep attempts.Report
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		if f := rep.Failures(); len(f) > 0 || len(rep.Results) != 2 {
			t.Fatalf("run %d: %+v", i, rep.Results)
		}
	}
}
