package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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

// netPolicy gives VMs a NIC (and so a netstack process each); the rule
// allows a name nothing resolves.
var netPolicy = strings.Replace(testPolicy, "[profile.sessions]", "[profile.network]\nmode = \"allowlist\"\nallow = [\"nothing.invalid:80\"]\n[profile.sessions]", 1)

// pidsOf lists the processes whose command line holds s.
func pidsOf(t *testing.T, s string) []string {
	t.Helper()
	out, _ := exec.Command("pgrep", "-f", s).Output()
	return strings.Fields(string(out))
}

// TestGateway_QEMUKilledMidCommand: kill -9 of a VM's QEMU while its
// command runs. The client gets 205 with a clear message, and the VM's
// directory, cgroup and netstack are gone.
func TestGateway_QEMUKilledMidCommand(t *testing.T) {
	bin := os.Getenv("VMGATE_TEST_BIN")
	if bin == "" {
		t.Skip("VMGATE_TEST_BIN not set")
	}
	// Cold boots: no template VM runs beside the command's, so its
	// netstack is the only one.
	d := gatewaytest.Start(t, netPolicy, nil)
	cmd := exec.Command(filepath.Join(bin, "vm-exec"), "--socket", d.Socket, "sh", "-c", "echo started; exec sleep 600")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("command: %q %v", line, err)
	}
	// The command's VM, by its id.
	st, err := d.Client.Status(context.Background())
	if err != nil || len(st.VMs) != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}
	vmID := st.VMs[0].VMID
	vmDir := filepath.Join(d.Config.VM.StateDir, "vms", vmID)
	qemu := pidsOf(t, "qemu-system.*"+vmDir)
	if len(qemu) != 1 {
		t.Fatalf("QEMU processes of %s: %v", vmDir, qemu)
	}
	pid, _ := strconv.Atoi(qemu[0])
	cg, _ := os.ReadFile("/proc/" + qemu[0] + "/cgroup")
	before := helpers(t)
	if len(before) != 1 {
		t.Fatalf("re-executed helper processes %v while the command runs, want its VM's netstack alone", before)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != wire.ExitVMFailed || !strings.Contains(stderr.String(), "vm") {
		t.Fatalf("client: %v, stderr %q; want exit %d", err, stderr.String(), wire.ExitVMFailed)
	}
	t.Logf("client after the kill: exit %d: %s", ee.ExitCode(), strings.TrimSpace(stderr.String()))
	// What the VM had goes: its directory, its cgroup, its netstack.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, dirErr := os.Stat(vmDir)
		left := !errors.Is(dirErr, os.ErrNotExist) || len(testutil.CgroupDirsOf(string(cg), vmID)) > 0 || len(helpers(t)) > 0
		if !left {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("left after the kill: dir %v, cgroups %v, helper processes %v (before %v)", dirErr, testutil.CgroupDirsOf(string(cg), vmID), helpers(t), before)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// And the daemon serves on.
	if res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo", "still here"}}, nil); res.ExitCode != 0 || so != "still here\n" {
		t.Fatalf("after the kill: %+v %q", res, so)
	}
}

// helpers lists the processes running this test binary other than the
// test itself: the daemon's re-executed roles that outlive a jail's exec
// (the netstacks; QEMU's jail becomes QEMU).
func helpers(t *testing.T) []string {
	t.Helper()
	// By file, not by name: a jailed helper sees its binary under
	// another path in its own root.
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == strconv.Itoa(os.Getpid()) {
			continue
		}
		if fi, err := os.Stat(filepath.Join("/proc", e.Name(), "exe")); err == nil && os.SameFile(fi, self) {
			out = append(out, e.Name())
		}
	}
	return out
}

// TestGateway_StateDiskFull puts the state directory on a small tmpfs.
// A guest that fills its disk fails at once with a clear error (before,
// QEMU stopped the guest and the command hung until its time limit). A
// request while the disk is full fails clearly and leaves no VM. Once
// space returns the daemon serves again without a restart, and the audit
// log has every request.
func TestGateway_StateDiskFull(t *testing.T) {
	testutil.RequiresRoot(t)
	// The daemon restores from the shared template; a build would need
	// more than this disk.
	tdir := filepath.Dir(sharedTemplate(t))

	mnt := testutil.Tmpfs(t, "96m")
	d := gatewaytest.Start(t, testPolicy, func(c *gateway.Config) {
		c.VM.StateDir, c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = mnt, false, 0, tdir
	})
	free := func() int64 {
		var st syscall.Statfs_t
		if err := syscall.Statfs(mnt, &st); err != nil {
			t.Fatal(err)
		}
		return int64(st.Bavail) * st.Bsize
	}
	waitFor(t, 2*time.Minute, "the template to load", func() bool {
		st, err := d.Client.Status(context.Background())
		return err == nil && len(st.Pools) == 1
	})
	if res, _, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}}, nil); res.ExitCode != 0 || res.VMStart != "restore" {
		t.Fatalf("true: %+v", res)
	}

	// The guest writes more than the disk holds.
	before := free()
	t0 := time.Now()
	res, _, se, err := d.Exec(t, wire.ExecRequest{Argv: []string{"dd", "if=/dev/zero", "of=/var/tmp/fill", "bs=1M", "count=200", "oflag=direct"}, TimeoutMS: 120_000}, nil)
	var fe *client.ExecFailedError
	if !errors.As(err, &fe) || fe.Body.Code != wire.CodeVM || !strings.Contains(err.Error(), vm.ErrStateDiskFull.Error()) {
		t.Fatalf("a guest filling the state disk: %v, result %+v, stderr %q after %v; want a %s error saying %q", err, res, se, time.Since(t0), wire.CodeVM, vm.ErrStateDiskFull)
	}
	t.Logf("after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	if n := len(vmDirs(mnt)); n != 0 {
		t.Fatalf("%d VM directories left", n)
	}
	if after := free(); after < before {
		t.Errorf("the VM's overlay was not given back: %d bytes free, %d before", after, before)
	}

	// The disk is full before the request.
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for {
		if _, err := filler.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
	}
	filler.Close()
	_, _, _, err = d.Exec(t, wire.ExecRequest{Argv: []string{"true"}}, nil)
	if ae := (*client.APIError)(nil); !errors.As(err, &ae) || ae.Body.Code != wire.CodeVM || !strings.Contains(err.Error(), "create overlay: write") || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("a request on a full state disk: %v", err)
	}
	t.Logf("on a full disk: %v", err)
	if n := len(vmDirs(mnt)); n != 0 {
		t.Fatalf("%d VM directories left", n)
	}
	// A full disk says nothing about the template: it stays.
	if st, err := d.Client.Status(context.Background()); err != nil || len(st.Pools) != 1 {
		t.Fatalf("the template after a request on a full disk: %+v %v", st, err)
	}

	// Space returns: served again, no restart.
	if err := os.Remove(filepath.Join(mnt, "filler")); err != nil {
		t.Fatal(err)
	}
	if res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo", "back"}}, nil); res.ExitCode != 0 || so != "back\n" || res.VMStart != "restore" {
		t.Fatalf("after space returned: %+v %q, want a restored VM", res, so)
	}

	t.Run("a pause the disk cannot hold", func(t *testing.T) { testPauseDiskFull(t, d, mnt) })
	d.StopAndCheck(t)
	if _, err := audit.VerifyFile(d.AuditPath); err != nil {
		t.Fatal(err)
	}
	var failed int
	for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
		if r.Kind == audit.KindExec && strings.Contains(strings.ToLower(r.Error), "no space left") {
			failed++
		}
	}
	if failed != 2 {
		t.Errorf("%d exec records with the disk's error, want 2", failed)
	}
}

// testPauseDiskFull pauses a session whose guest RAM holds more than the
// state disk has free (100 MiB in its tmpfs, on a 96 MiB disk). The pause
// fails with a clear error saying the disk is full and that the session
// keeps running; no part of the save point is left; the session runs on
// in its VM, with its files.
func testPauseDiskFull(t *testing.T, d *gatewaytest.Daemon, mnt string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, _, se := d.MustExec(t, wire.ExecRequest{Argv: []string{"sh", "-c", "yes kept | head -c 100M > /dev/shm/big && echo kept > /root/f"}, Session: "s"}, nil)
	if res.ExitCode != 0 {
		t.Fatalf("the session's files: %+v %q", res, se)
	}
	vmID := res.VMID
	_, err := d.Client.PauseSession(ctx, "s")
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Body.Code != wire.CodeVM || !strings.Contains(ae.Body.Error, `pause session "s"`) ||
		!strings.Contains(ae.Body.Error, vm.ErrStateDiskFull.Error()) || !strings.Contains(ae.Body.Error, "; the session keeps running") {
		t.Fatalf("a pause on a full state disk: %v; want a %s error saying %q and that the session keeps running", err, wire.CodeVM, vm.ErrStateDiskFull)
	}
	t.Logf("the pause: %v", err)
	left, _ := filepath.Glob(filepath.Join(mnt, "sessions", "*", "sp-*"))
	if len(left) != 0 {
		t.Errorf("a failed pause left %v", left)
	}
	if n := len(vmDirs(mnt)); n != 1 {
		t.Errorf("%d VM directories after a failed pause, want the session's alone", n)
	}
	res, so, se := d.MustExec(t, wire.ExecRequest{Argv: []string{"sh", "-c", "cat /root/f; wc -c < /dev/shm/big"}, Session: "s"}, nil)
	if res.ExitCode != 0 || so != "kept\n104857600\n" || res.VMID != vmID {
		t.Errorf("the session after its failed pause: %+v %q %q, want its files in VM %s", res, so, se, vmID)
	}
	if err := d.Client.EndSession(ctx, "s"); err != nil {
		t.Fatal(err)
	}
}

// sharedTemplate makes sure the shared template of the default shape
// exists and returns its directory.
func sharedTemplate(t *testing.T) string {
	t.Helper()
	img := testutil.RequiresImage(t)
	tdir := testutil.TemplateDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	tm, err := vm.EnsureTemplate(ctx, vm.Options{Runtime: vm.Runtime{StateDir: t.TempDir(), Accel: vm.AccelAuto, TemplateDir: tdir}, ImageDir: img})
	if err != nil {
		t.Fatal(err)
	}
	tm.Close()
	return tm.Dir
}

// TestGateway_DamagedTemplate: the state file of the template a running
// daemon restores from is cut short on disk. The next request still gets
// its result (its restore fails and its VM boots cold); the template is
// discarded, rebuilt on the request after, and later requests restore
// from the new one.
func TestGateway_DamagedTemplate(t *testing.T) {
	shared := sharedTemplate(t)
	tdir := t.TempDir() // damaged here: never the shared templates
	dir := filepath.Join(tdir, filepath.Base(shared))
	if out, err := exec.Command("cp", "-a", "--sparse=always", shared, dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the template: %v %s", err, out)
	}
	d := gatewaytest.Start(t, testPolicy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 0, tdir
	})
	ctx := context.Background()
	ready := func() bool {
		st, err := d.Client.Status(ctx)
		return err == nil && len(st.Pools) == 1
	}
	waitFor(t, 2*time.Minute, "the template to load", ready)
	exe := func(want string) {
		t.Helper()
		res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo", "ok"}}, nil)
		if res.ExitCode != 0 || so != "ok\n" || res.VMStart != want {
			t.Fatalf("exec: %+v %q, want a VM from %s", res, so, want)
		}
	}
	exe("restore")
	before, err := os.ReadFile(filepath.Join(dir, vm.TemplateMetaFile))
	if err != nil {
		t.Fatal(err)
	}

	state := filepath.Join(dir, vm.TemplateStateFile)
	fi, err := os.Stat(state)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(state, fi.Size()/2); err != nil {
		t.Fatal(err)
	}
	exe("boot") // the restore fails; the request is served anyway
	if ready() {
		t.Fatal("the damaged template is still in use")
	}
	exe("boot") // and starts the rebuild
	waitFor(t, 5*time.Minute, "the template to be rebuilt", ready)
	exe("restore")
	after, err := os.ReadFile(filepath.Join(dir, vm.TemplateMetaFile))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(before, after) {
		t.Fatal("the template was not rebuilt")
	}
	d.StopAndCheck(t)
}
