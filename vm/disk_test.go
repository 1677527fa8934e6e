package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

func TestOverlayLimit(t *testing.T) {
	for _, c := range []struct {
		disk, image int
		want        uint64
	}{
		{1024, 4096, (1024 + 128 + overlayMarginMiB) << 20},
		{64, 4096, (64 + 8 + overlayMarginMiB) << 20},
		// A limit above the disk is the disk: a guest cannot hold more.
		{1 << 20, 4096, (4096 + 512 + overlayMarginMiB) << 20},
		// An image whose disk size is unknown keeps the limit.
		{1024, 0, (1024 + 128 + overlayMarginMiB) << 20},
		{-5, 4096, overlayMarginMiB << 20},
	} {
		if got := OverlayLimit(c.disk, c.image); got != c.want {
			t.Errorf("OverlayLimit(%d, %d) = %d MiB, want %d MiB", c.disk, c.image, got>>20, c.want>>20)
		}
	}
	// The limit is the host's bound: it grows with the disk limit, and a
	// 4 GiB image's default is far below the 3.5 GiB a guest could take.
	if OverlayLimit(DefaultDiskMiB, 4096) >= 2<<30 || OverlayLimit(512, 4096) >= OverlayLimit(1024, 4096) {
		t.Error("OverlayLimit does not follow the disk limit")
	}
}

func TestFileSizeLimit(t *testing.T) {
	ov := OverlayLimit(1024, 4096)
	for _, c := range []struct {
		name    string
		ram     int
		overlay uint64
		want    uint64
	}{
		// A clone or a cold boot writes its overlay and nothing large
		// besides: its RAM is QEMU's memory or a private mapping.
		{"vm", 0, ov, ov},
		// A template build writes its RAM file too.
		{"template, small RAM", 512, ov, ov},
		{"template, large RAM", 4096, ov, (4096 + 64) << 20},
		// The accelerator probe writes its console and log only.
		{"probe", 0, 0, 64 << 20},
	} {
		if got := FileSizeLimit(c.ram, c.overlay); got != c.want {
			t.Errorf("%s: FileSizeLimit(%d, %d MiB) = %d MiB, want %d MiB", c.name, c.ram, c.overlay>>20, got>>20, c.want>>20)
		}
		if FileSizeLimit(c.ram, c.overlay) == 0 {
			t.Errorf("%s: 0 is no limit at all", c.name)
		}
	}
}

// TestJailFileSize checks the jail each kind of launch gets: the disk
// limit, not the image, bounds the overlay of a VM; a template build's
// bound also fits its RAM file.
func TestJailFileSize(t *testing.T) {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64 to build a jail for")
	}
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		o    jailOpts
		want uint64
	}{
		{"vm", jailOpts{memMiB: 4096, overlay: OverlayLimit(64, 4096)}, OverlayLimit(64, 4096)},
		{"template", jailOpts{memMiB: 4096, overlay: OverlayLimit(64, 4096), ramFile: true}, (4096 + 64) << 20},
	} {
		c.o.vmDir, c.o.accel = dir, AccelTCG
		spec, err := c.o.spec([]string{"qemu-system-x86_64"})
		if err != nil {
			t.Fatal(err)
		}
		if spec.FileSize != c.want {
			t.Errorf("%s: RLIMIT_FSIZE %d MiB, want %d MiB", c.name, spec.FileSize>>20, c.want>>20)
		}
	}
}

// TestReserveScript runs the guest's reserve script on a small tmpfs: the
// free space left is the limit, the reserve belongs to root with mode
// 0400, a limit above the free space makes no reserve, and a device
// tune2fs cannot tune is a note on stderr, not a failure.
func TestReserveScript(t *testing.T) {
	for _, tool := range []string{"sh", "stat", "fallocate"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("no %s", tool)
		}
	}
	mnt := testutil.Tmpfs(t, "64m")
	run := func(limitMiB int) (string, string) {
		t.Helper()
		argv := reserveArgv(limitMiB, mnt, filepath.Join(mnt, "no-such-device"))
		cmd := exec.CommandContext(context.Background(), argv[0], argv[1:]...)
		var so, se strings.Builder
		cmd.Stdout, cmd.Stderr = &so, &se
		if err := cmd.Run(); err != nil {
			t.Fatalf("reserve %d MiB: %v\nstdout: %s\nstderr: %s", limitMiB, err, so.String(), se.String())
		}
		return so.String(), se.String()
	}
	so, se := run(16)
	if !strings.Contains(so, "reserve=") || !strings.Contains(se, "reserved blocks are kept") {
		t.Errorf("stdout %q stderr %q", so, se)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	if free := int64(st.Bfree) * st.Bsize; free > 16<<20 || free < 15<<20 {
		t.Errorf("%d bytes free after the reserve, want 16 MiB", free)
	}
	fi, err := os.Stat(filepath.Join(mnt, reserveName))
	if err != nil {
		t.Fatal(err)
	}
	if uid := fi.Sys().(*syscall.Stat_t).Uid; fi.Mode().Perm() != 0o400 || uid != uint32(os.Getuid()) {
		t.Errorf("reserve file mode %v uid %d", fi.Mode(), uid)
	}
	if err := os.Remove(filepath.Join(mnt, reserveName)); err != nil {
		t.Fatal(err)
	}
	if so, _ := run(1024); !strings.Contains(so, "reserve=0") {
		t.Errorf("a limit above the free space: %q", so)
	}
	if _, err := os.Stat(filepath.Join(mnt, reserveName)); err == nil {
		t.Error("a reserve was made with a limit above the free space")
	}

	// A guest without fallocate: exit 127, which the boot step takes for
	// an image that cannot (a logged relaxation), not a failed reserve.
	bin := t.TempDir()
	stat, _ := exec.LookPath("stat")
	if err := os.Symlink(stat, filepath.Join(bin, "stat")); err != nil {
		t.Fatal(err)
	}
	sh, _ := exec.LookPath("sh")
	argv := reserveArgv(16, mnt, "/dev/null")
	cmd := exec.Command(sh, argv[1:]...)
	cmd.Env = []string{"PATH=" + bin}
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != agentproto.ExitNotFound || !strings.Contains(string(out), "no fallocate") {
		t.Errorf("without fallocate: %v: %s", err, out)
	}
}

// checkDiskLimit checks a running VM against the disk limit diskMiB: its
// QEMU's RLIMIT_FSIZE is the overlay's hard bound (whatever its RAM), and
// its guest may write at most the limit, root and the unprivileged user
// alike. Used by the VM tests on a cold boot and on a template's clone.
func checkDiskLimit(t *testing.T, v *VM, imageMiB, diskMiB int) {
	t.Helper()
	limits, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(v.Pid()), "limits"))
	if err != nil {
		t.Fatal(err)
	}
	want := strconv.FormatUint(OverlayLimit(diskMiB, imageMiB), 10)
	for _, line := range strings.Split(string(limits), "\n") {
		if f := strings.Fields(line); strings.HasPrefix(line, "Max file size") && (len(f) < 5 || f[3] != want || f[4] != want) {
			t.Errorf("RLIMIT_FSIZE: %s; want %s (the overlay's bound for %d MiB)", line, want, diskMiB)
		}
	}
	o := run(t, v, ExecRequest{Argv: []string{"sh", "-c", "stat -f -c '%a %f %S' /; stat -c '%U %a' " + ReserveFile}})
	f := strings.Fields(o.stdout)
	if o.res.ExitCode != 0 || len(f) != 5 {
		t.Fatalf("guest: %+v %q %q", o.res, o.stdout, o.stderr)
	}
	avail, _ := strconv.ParseInt(f[0], 10, 64)
	free, _ := strconv.ParseInt(f[1], 10, 64)
	bsize, _ := strconv.ParseInt(f[2], 10, 64)
	// The guest has written a little since the reserve was made.
	if lim := int64(diskMiB) << 20; avail*bsize > lim || avail*bsize < lim*3/4 || avail > free {
		t.Errorf("guest: %d bytes to write (%d free), want a little under %d", avail*bsize, free*bsize, lim)
	}
	if f[3] != "root" || f[4] != "400" {
		t.Errorf("reserve file owner and mode: %s %s", f[3], f[4])
	}
}
