package cli

import (
	"os"
	"path/filepath"
	"strings"
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
	// A link to a directory that does not exist is named, with the fix;
	// nothing is created behind it.
	links := t.TempDir()
	link, target := filepath.Join(links, "state"), filepath.Join(links, "data", "vmgate")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	err := ensureStateDir(link)
	if err == nil || !strings.Contains(err.Error(), link+" is a symlink to "+target+", which does not exist: point the link at an existing directory") {
		t.Errorf("a dangling link: %v", err)
	}
	if _, err := os.Lstat(target); err == nil {
		t.Error("the link's target was created")
	}
}
