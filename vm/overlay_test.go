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
	cached := imageBlanks.len
	ctx := context.Background()
	n0, sizes0 := cached(), sizeBlanks.len()
	for i := range 3 {
		base := filepath.Join(dir, fmt.Sprintf("sp%d.qcow2", i))
		qemuImg(t, "create", "-q", "-f", "qcow2", base, "1G")
		// A size no other test uses: its blank is made here.
		if err := createOverlayOf(ctx, base, filepath.Join(dir, fmt.Sprintf("o%d.qcow2", i)), 1001); err != nil {
			t.Fatal(err)
		}
	}
	if n := cached(); n != n0 {
		t.Errorf("%d cached after 3 overlays on save points' disks, want %d", n, n0)
	}
	if n := sizeBlanks.len(); n != sizes0+1 {
		t.Errorf("%d blank overlays kept by disk size after 3 on save points' disks of one new size, want %d", n, sizes0+1)
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

// TestSavePointOverlays: an overlay on a save point's disk is, byte for
// byte, what qemu-img makes for it, whether the kept blank overlay's
// backing name is shorter, as long or longer than its own, and whether
// it is the first of its size; qemu-img check finds nothing wrong in it.
func TestSavePointOverlays(t *testing.T) {
	testutil.RequiresQEMU(t)
	dir := t.TempDir()
	ctx := context.Background()
	for i, name := range []string{
		"sessions/0123456789abcdef/sp-01234567/overlay.qcow2",
		"sessions/fedcba9876543210/sp-89abcdef/overlay.qcow2", // as long
		"f/overlay.qcow2", // shorter
		"forks/0123456789abcdef/a/much/longer/path/than/the/others/overlay.qcow2",
	} {
		backing := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(backing), 0o700); err != nil {
			t.Fatal(err)
		}
		qemuImg(t, "create", "-q", "-f", "qcow2", backing, "768M")
		got := filepath.Join(dir, fmt.Sprintf("got%d.qcow2", i))
		if err := createOverlayOf(ctx, backing, got, 768); err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(dir, fmt.Sprintf("want%d.qcow2", i))
		qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", backing, "-u", want, "768M")
		g, _ := os.ReadFile(got)
		w, _ := os.ReadFile(want)
		if !bytes.Equal(g, w) {
			t.Errorf("overlay on %s differs from qemu-img's", name)
		}
		qemuImg(t, "check", "-q", got)
	}
}

// TestWithBacking: withBacking refuses images it cannot rename safely.
func TestWithBacking(t *testing.T) {
	testutil.RequiresQEMU(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "blank.qcow2")
	qemuImg(t, "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", "/a/backing.qcow2", "-u", p, "1G")
	blank, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	const nameAt = 16 // the backing file name's length
	edit := func(f func(b []byte)) []byte {
		b := bytes.Clone(blank)
		f(b)
		return b
	}
	off := int(blank[15]) | int(blank[14])<<8 // the name's offset (small)
	for _, c := range []struct {
		name, backing string
		blank         []byte
		want          string // "" for success
	}{
		{"renamed", "/b/backing.qcow2", blank, ""},
		{"not qcow2", "/b", append([]byte("QFI\x00"), blank[4:]...), "not a qcow2"},
		{"cut", "/b", blank[:20], "not a qcow2"},
		{"name past the first cluster", "/b", edit(func(b []byte) { b[nameAt+1] = 0x01 }), "not in the first cluster"},
		{"something after the name", "/b", edit(func(b []byte) { b[off+200] = 'x' }), "follows the backing file name"},
		{"name too long", "/" + strings.Repeat("x", maxBackingName), blank, "1024 bytes"},
		{"empty name", "", blank, "0 bytes"},
	} {
		got, err := withBacking(c.blank, c.backing)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
		case c.want == "":
			out := filepath.Join(dir, "renamed.qcow2")
			if err := os.WriteFile(out, got, 0o600); err != nil {
				t.Fatal(err)
			}
			if info := qemuImg(t, "info", "-U", out); !strings.Contains(info, "backing file: "+c.backing) {
				t.Errorf("%s: qemu-img info:\n%s", c.name, info)
			}
		}
	}
	if again, _ := os.ReadFile(p); !bytes.Equal(blank, again) {
		t.Error("withBacking changed the blank it was given")
	}
}
