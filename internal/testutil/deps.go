package testutil

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// Deps returns the packages pkg depends on, itself and the standard library
// included (go list -deps, for the build's GOOS/GOARCH and env), so that a
// test can hold a package's dependencies to what it should link.
func Deps(t testing.TB, env []string, pkg string) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", pkg)
	cmd.Env = append(cmd.Environ(), env...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v %s", pkg, err, stderr)
	}
	return strings.Fields(string(out))
}
