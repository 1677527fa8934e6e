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

	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
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
	st, err := d.Client.StatusReport(context.Background())
	if err != nil || len(st.VMs) != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}
	vmID := st.VMs[0].VMID
	vmDir := filepath.Join(d.Config.StateDir, "vms", vmID)
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
