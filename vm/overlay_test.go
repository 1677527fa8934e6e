package vm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testutil"
)

func qemuImg(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %q: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestOverlaysFromCache: later overlays are copies of the first blank
// one, each its own file, and as qemu-img makes them; a backing file that
// changes gets a blank overlay of its own.
func TestOverlaysFromCache(t *testing.T) {
	testutil.RequiresQEMU(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", base, "1G")
	ctx := context.Background()
	a, b := filepath.Join(dir, "a.qcow2"), filepath.Join(dir, "b.qcow2")
	for _, p := range []string{a, b} {
		if err := createOverlay(ctx, base, p); err != nil {
			t.Fatal(err)
		}
	}
	ref := filepath.Join(dir, "ref.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base, ref)
	want, _ := os.ReadFile(ref)
	for _, p := range []string{a, b} {
		got, _ := os.ReadFile(p)
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from qemu-img's overlay", p)
		}
		qemuImg(t, "check", "-q", p)
	}
	// Writing one overlay leaves the other, and the cache, alone.
	if out, err := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0x5a 0 64k", a).CombinedOutput(); err != nil {
		t.Fatalf("qemu-io: %v\n%s", err, out)
	}
	if got, _ := os.ReadFile(b); !bytes.Equal(got, want) {
		t.Error("writing one overlay changed another")
	}
	c := filepath.Join(dir, "c.qcow2")
	if err := createOverlay(ctx, base, c); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(c); !bytes.Equal(got, want) {
		t.Error("the cached blank overlay changed")
	}
	if err := createOverlay(ctx, base, c); err == nil {
		t.Error("an existing overlay was overwritten")
	}
	// A rebuilt backing file of another size.
	if err := os.Remove(base); err != nil {
		t.Fatal(err)
	}
	qemuImg(t, "create", "-q", "-f", "qcow2", base, "2G")
	now := time.Now().Add(time.Second)
	_ = os.Chtimes(base, now, now)
	d := filepath.Join(dir, "d.qcow2")
	if err := createOverlay(ctx, base, d); err != nil {
		t.Fatal(err)
	}
	if info := qemuImg(t, "info", d); !strings.Contains(info, "virtual size: 2 GiB") {
		t.Errorf("overlay of the rebuilt base:\n%s", info)
	}
}

// TestOverlayCacheKeepsImagesOnly: overlays on an image's base are made
// from the cache; overlays on a save point's disk (a size given: one
// resume or fork each) are not kept in it, so pausing and resuming
// without end does not grow the daemon.
func TestOverlayCacheKeepsImagesOnly(t *testing.T) {
	testutil.RequiresQEMU(t)
	dir := t.TempDir()
	cached := func() int {
		blankOverlays.Lock()
		defer blankOverlays.Unlock()
		return len(blankOverlays.m)
	}
	ctx := context.Background()
	n0 := cached()
	for i := range 3 {
		base := filepath.Join(dir, fmt.Sprintf("sp%d.qcow2", i))
		qemuImg(t, "create", "-q", "-f", "qcow2", base, "1G")
		if err := createOverlayOf(ctx, base, filepath.Join(dir, fmt.Sprintf("o%d.qcow2", i)), 1024); err != nil {
			t.Fatal(err)
		}
	}
	if n := cached(); n != n0 {
		t.Errorf("%d cached after 3 overlays on save points' disks, want %d", n, n0)
	}
	base := filepath.Join(dir, "base.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", base, "1G")
	if err := createOverlay(ctx, base, filepath.Join(dir, "img.qcow2")); err != nil {
		t.Fatal(err)
	}
	if n := cached(); n != n0+1 {
		t.Errorf("%d cached after an overlay on an image's base, want %d", n, n0+1)
	}
}
