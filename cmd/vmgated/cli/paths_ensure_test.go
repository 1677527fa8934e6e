package cli

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEnsureStateDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := ensureStateDir(dir); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("%v %v", fi.Mode(), err)
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := ensureStateDir(file); err == nil {
		t.Error("a file is no state directory")
	}
	if err := ensureStateDir(""); err == nil {
		t.Error("no directory at all")
	}
}
