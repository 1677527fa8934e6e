package testutil

import (
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BuildStatic builds the Go package pkg without cgo into dir (a new
// temporary directory when dir is empty) and checks that the binary is
// static: it has no program interpreter. It returns the binary's path.
func BuildStatic(t testing.TB, pkg, dir string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = "/usr/local/go/bin/go"
	}
	if dir == "" {
		dir = t.TempDir()
	}
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command(goTool, "build", "-trimpath", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build %s: %v\n%s", pkg, err, out)
	}
	if err := checkStatic(bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

// checkStatic fails for an ELF binary with a program interpreter.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New(bin + " is dynamically linked (it has a program interpreter)")
		}
	}
	return nil
}
