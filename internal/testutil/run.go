package testutil

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Run runs cmd and returns its stdout, its stderr and its exit status
// (0, or the status it exited with); a command that cannot be run or is
// killed by a signal fails the test. cmd's Stdout and Stderr must be unset.
func Run(t testing.TB, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		code = ee.ExitCode()
	default:
		t.Fatalf("run %s: %v\nstderr: %s", cmd.Path, err, se.String())
	}
	return so.String(), se.String(), code
}

// Binary is the path of the built program name in VMGATE_TEST_BIN (make
// test sets it). Without it the test is skipped (fails under CI); a
// program missing there fails it.
func Binary(t testing.TB, name string) string {
	t.Helper()
	dir := os.Getenv("VMGATE_TEST_BIN")
	if dir == "" {
		SkipOrFail(t, "VMGATE_TEST_BIN not set: run the suite with `make test`")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("built binary: %v", err)
	}
	return p
}
