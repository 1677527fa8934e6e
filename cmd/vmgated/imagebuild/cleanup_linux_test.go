package imagebuild

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/testutil"
)

func TestLockOutExcludesSecondBuild(t *testing.T) {
	out := filepath.Join(t.TempDir(), "image")
	unlock, err := lockOut(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lockOut(out); err == nil || !strings.Contains(err.Error(), "another build") {
		t.Fatalf("second lock: %v", err)
	}
	unlock()
	unlock2, err := lockOut(out)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	unlock2()
}

// TestRemoveBuildDirDetachesMounts mimics an mmdebstrap killed with its
// chroot's file systems still mounted.
func TestRemoveBuildDirDetachesMounts(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := filepath.Join(t.TempDir(), ".image.build-1")
	mp := filepath.Join(dir, "chroot", "proc")
	if err := os.MkdirAll(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount: %v", err)
	}
	if err := os.WriteFile(filepath.Join(mp, "precious"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, _ := mountsUnder(dir); len(got) != 1 || got[0] != mp {
		t.Fatalf("mountsUnder = %v", got)
	}
	if err := removeBuildDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dir still there: %v", err)
	}
}

func TestRemoveSameDeviceRefusesMountPoints(t *testing.T) {
	testutil.RequiresRoot(t)
	dir := t.TempDir()
	mp := filepath.Join(dir, "a", "dev")
	if err := os.MkdirAll(mp, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mp, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount: %v", err)
	}
	defer unix.Unmount(mp, unix.MNT_DETACH)
	keep := filepath.Join(mp, "keep")
	if err := os.WriteFile(keep, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := removeSameDevice(dir); err == nil || !strings.Contains(err.Error(), "still mounted") {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Fatalf("file on the other file system was touched: %v", err)
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/a\040b/c`); got != "/a b/c" {
		t.Fatalf("got %q", got)
	}
}
