package gateway_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/image"
)

// diskPolicy gives root sessions a small disk, so that filling it is
// quick under TCG.
const diskPolicy = `version = 1
[[profile]]
name = "disk"
match = { any = true }
user = "root"
allow_shell = true
disk_mib = 64
timeout = { default = "5m", max = "10m" }
sessions = { allowed = true }
`

// TestGateway_DiskLimit: a guest that writes until its disk is full (dd
// with no count) gets ENOSPC inside, as its profile's disk_mib says, and
// its VM runs on; the host's copy of its disk stays within the limit and
// its margin, and the exec record says how large it is. A guest root that
// deletes the reserve behind the limit meets the host's hard bound: its
// write fails in the guest, the overlay file stays within the bound, the
// daemon serves on and nothing of the VM is left once it ends. One cold
// boot.
func TestGateway_DiskLimit(t *testing.T) {
	img := testutil.RequiresImage(t)
	man, err := image.ReadManifest(img)
	if err != nil {
		t.Fatal(err)
	}
	bound := vm.OverlayLimit(64, man.Inputs.DiskSizeMiB)
	d := gatewaytest.Start(t, diskPolicy, nil)
	sh := func(cmd string) (*wire.Result, string, string) {
		t.Helper()
		return d.MustExec(t, wire.ExecRequest{Argv: []string{cmd}, Shell: true, Session: "disk"}, nil)
	}

	// The normal case: ENOSPC at the limit, from the guest's own kernel.
	// What dd wrote reaches the disk by sync: ext4 allocates at write but
	// writes back later, and the overlay is compared with it below.
	res, _, se := sh("dd if=/dev/zero of=/root/big bs=1M; s=$?; sync; exit $s")
	if res.ExitCode != 1 || !strings.Contains(se, "No space left on device") {
		t.Fatalf("dd into a full disk: %+v, stderr %q; want exit 1 with ENOSPC", res, se)
	}
	overlay := filepath.Join(d.Config.VM.StateDir, "vms", res.VMID, vm.OverlayFile)
	size := func() int64 {
		t.Helper()
		fi, err := os.Stat(overlay)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	full := size()
	// The VM runs on, and the guest wrote what its limit allows (its
	// file system keeps a little for itself), not more.
	res, so, se := sh("stat -c %s /root/big; test -e " + vm.ReserveFile + " && echo reserve present")
	var written int64
	if f := strings.Fields(so); len(f) > 0 {
		written, _ = strconv.ParseInt(f[0], 10, 64)
	}
	if res.ExitCode != 0 || written < 48<<20 || written > 64<<20 || !strings.Contains(so, "reserve present") {
		t.Fatalf("after ENOSPC: %+v, stdout %q, stderr %q; want the VM alive with 48 to 64 MiB written and its reserve", res, so, se)
	}
	t.Logf("guest wrote %d MiB; overlay %d MiB, bound %d MiB", written>>20, full>>20, bound>>20)
	if full > int64(bound) || full < written {
		t.Errorf("overlay %d bytes after the guest wrote %d: want between the two and within the bound %d", full, written, bound)
	}

	// The hard bound: a guest root deletes the reserve and writes on,
	// past the bound (its file system now has gigabytes free).
	res, _, se = sh("rm " + vm.ReserveFile + " && dd if=/dev/zero of=/root/big2 bs=1M oflag=direct")
	if res.ExitCode == 0 || strings.Contains(se, "No space left on device") {
		t.Fatalf("dd past the host's bound: %+v, stderr %q; want a failed write that is no ENOSPC", res, se)
	}
	t.Logf("past the bound: exit %d, %s", res.ExitCode, strings.TrimSpace(se))
	if got := size(); got > int64(bound) || got <= full {
		t.Errorf("overlay %d bytes after the guest wrote past its bound %d (%d before)", got, bound, full)
	}
	res, so, _ = sh("echo alive")
	if res.ExitCode != 0 || so != "alive\n" {
		t.Fatalf("after the hard bound: %+v %q", res, so)
	}
	if err := d.Client.EndSession(context.Background(), "disk"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client.Status(context.Background()); err != nil {
		t.Fatalf("the daemon after the hard bound: %v", err)
	}
	if dirs := vmDirs(d.Config.VM.StateDir); len(dirs) != 0 {
		t.Errorf("VM directories left after the session ended: %v", dirs)
	}
	if qemu := pidsOf(t, "qemu-system.*"+res.VMID); len(qemu) != 0 {
		t.Errorf("QEMU of the ended session still runs: %v", qemu)
	}

	// Every exec record of the session has the overlay's size, within the
	// bound.
	d.StopAndCheck(t)
	n := 0
	for _, r := range testutil.JSONLines[audit.Record](t, d.AuditPath) {
		if r.Kind != audit.KindExec || r.Session != "disk" {
			continue
		}
		n++
		if r.DiskBytes <= 0 || r.DiskBytes > int64(bound) {
			t.Errorf("exec record %s: disk_bytes %d, want 1 to %d", r.RequestID, r.DiskBytes, bound)
		}
	}
	if n != 4 {
		t.Errorf("%d exec records of the session, want 4", n)
	}
}
