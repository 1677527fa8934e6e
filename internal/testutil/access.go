package testutil

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ForOthers returns path itself when every directory above it lets any
// user through, else a copy (hard links where possible) in a directory
// that does. Tests that run something as an unprivileged user need it:
// the checkout or the state directory may sit below a 0700 directory
// (mktemp -d), which root passes and nobody does not.
func ForOthers(t testing.TB, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	if othersCanReach(abs) {
		return abs
	}
	dir := t.TempDir()
	for d := dir; d != filepath.Dir(d) && d != os.TempDir(); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	dst := filepath.Join(dir, filepath.Base(abs))
	if exec.Command("cp", "-al", abs, dst).Run() != nil {
		_ = os.RemoveAll(dst)
		if out, err := exec.Command("cp", "-a", abs, dst).CombinedOutput(); err != nil {
			t.Fatalf("copy %s for other users: %v: %s", abs, err, out)
		}
	}
	// Directories are new inodes: open them to others. Files may be hard
	// links to the originals and keep their modes (an image's private key
	// stays private).
	_ = filepath.Walk(dst, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			_ = os.Chmod(p, fi.Mode().Perm()|0o005)
		}
		return nil
	})
	if st, err := os.Stat(dst); err == nil && !st.IsDir() && st.Mode().Perm()&0o005 != 0o005 && st.Mode().Perm()&0o100 != 0 {
		// A single program (vm-exec): a private copy, then make it runnable.
		_ = os.Remove(dst)
		if out, err := exec.Command("cp", abs, dst).CombinedOutput(); err != nil {
			t.Fatalf("copy %s: %v: %s", abs, err, out)
		}
		_ = os.Chmod(dst, 0o755)
	}
	return dst
}

// othersCanReach reports whether every directory above p has o+x.
func othersCanReach(p string) bool {
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}
