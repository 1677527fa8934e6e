// Package testutil holds test gates shared by vmgate's packages: tests that
// need QEMU, a built guest image or root skip or fail with one clear reason.
//
// A gate skips only when the environment says the dependency is absent on
// purpose (testing.Short, or no image configured outside CI); under CI
// (CI=true) a missing dependency fails the test, so a broken CI setup cannot
// turn the integration suite into a row of silent skips.
package testutil

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/internal/reexec"
)

// inCI reports whether the tests run under CI, where every gate must pass.
func inCI() bool { return os.Getenv("CI") == "true" }

// SkipOrFail skips the test, or fails it under CI (CI=true), where
// every gate must pass.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	if inCI() {
		t.Fatalf("CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequiresQEMU skips (fails under CI) when qemu-system-x86_64 or qemu-img
// are missing, and skips in -short mode.
func RequiresQEMU(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM: skipped in -short mode")
	}
	for _, b := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(b); err != nil {
			SkipOrFail(t, "%s not installed (apt-get install qemu-system-x86 qemu-utils)", b)
		}
	}
}

// RequiresImage returns the built guest image directory from
// VMGATE_TEST_IMAGE (set by `make test`), after RequiresQEMU.
func RequiresImage(t testing.TB) string {
	t.Helper()
	RequiresQEMU(t)
	dir := os.Getenv("VMGATE_TEST_IMAGE")
	if dir == "" {
		SkipOrFail(t, "VMGATE_TEST_IMAGE not set: run the suite with `make test`, which builds the image")
	}
	if _, err := os.Stat(dir + "/manifest.json"); err != nil {
		SkipOrFail(t, "VMGATE_TEST_IMAGE=%s holds no built image: %v", dir, err)
	}
	return dir
}

// RequiresRoot skips unless running as root; VMGATE_SKIP_ROOT_TESTS forces
// a skip even then.
func RequiresRoot(t testing.TB) {
	t.Helper()
	if os.Getenv("VMGATE_SKIP_ROOT_TESTS") != "" {
		t.Skip("VMGATE_SKIP_ROOT_TESTS set")
	}
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root")
	}
}

// RequiresKVM skips when /dev/kvm cannot be opened. It never fails under
// CI: the CI machines have no usable KVM.
func RequiresKVM(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	f.Close()
}

// TemplateDir is where tests keep VM templates: VMGATE_TEST_TEMPLATES (set
// by `make test`, so that one template per shape serves the whole run),
// else a directory of this test's own.
func TemplateDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("VMGATE_TEST_TEMPLATES"); d != "" {
		return d
	}
	return t.TempDir()
}

// ReadFile returns the file's content, failing the test when it cannot be
// read.
func ReadFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// JSONLines decodes a file of one JSON value per line (an audit log).
func JSONLines[T any](t testing.TB, path string) []T {
	t.Helper()
	var out []T
	for _, line := range strings.Split(strings.TrimSpace(ReadFile(t, path)), "\n") {
		var v T
		if err := json.Unmarshal([]byte(line), &v); err != nil {
			t.Fatalf("%s: line %q: %v", path, line, err)
		}
		out = append(out, v)
	}
	return out
}

// Tmpfs mounts a tmpfs of the given size ("8k", "96m") in a directory of
// the test's and returns its path; it is unmounted at the end of the test.
// A small filesystem that fills up is how the tests meet a full disk.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	RequiresRoot(t)
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// Main runs a package's tests in a test binary that also serves as the
// re-exec child of the jail and the netstack, as vmgated does (package
// reexec): a test that starts a VM or a netstack runs it through the
// test binary. Call it from TestMain.
func Main(m *testing.M) {
	reexec.MaybeRunChild()
	os.Exit(m.Run())
}
