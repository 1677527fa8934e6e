package vm

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRestoreJail: the jail of a VM restored from a save point shows its
// QEMU the save point's disk, the one file of it that QEMU opens (its
// RAM and state come as fds), and neither the save point's directory nor
// its savepoint.json, which holds the key of its keyed checks: the guest
// never learns the key (vm/savepoint.go, docs/security.md). Checked on
// the restore's launch mode and on the jail's spec built from it.
func TestRestoreJail(t *testing.T) {
	sp := &SavePoint{Dir: filepath.Join(t.TempDir(), "sessions", "s1", "pause-1")}
	img := &imageFiles{base: "/srv/image/base.qcow2", kernel: "/srv/image/vmlinuz", initrd: "/srv/image/initrd.img"}
	m := sp.restoreMode(img, restoredRAM{mode: ramSharedFD}, nil)
	seen := func(what string, ro []string) {
		t.Helper()
		if covering(ro, filepath.Join(sp.Dir, OverlayFile)) == "" {
			t.Errorf("%s: the save point's disk is not bound: %q", what, ro)
		}
		for _, hidden := range []string{SavePointMetaFile, RAMFile, TemplateStateFile, "a file added later"} {
			if by := covering(ro, filepath.Join(sp.Dir, hidden)); by != "" {
				t.Errorf("%s: the save point's %s is bound, by %s", what, hidden, by)
			}
		}
		if slices.Contains(ro, sp.Dir) {
			t.Errorf("%s: the save point's directory is bound", what)
		}
	}
	seen("launch mode", m.readOnly)
	for _, f := range img.qemuFiles() {
		if !slices.Contains(m.readOnly, f) {
			t.Errorf("launch mode: the image's %s is not bound: %q", f, m.readOnly)
		}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64 to build a jail for")
	}
	o := jailOpts{vmDir: t.TempDir(), readOnly: m.readOnly, accel: AccelTCG, memMiB: 512, incoming: true}
	spec, err := o.spec([]string{"qemu-system-x86_64"})
	if err != nil {
		t.Fatal(err)
	}
	seen("jail spec", spec.ReadOnly)
	if by := covering(spec.ReadWrite, sp.Dir); by != "" {
		t.Errorf("jail spec: the save point is writable, by %s", by)
	}
}

// covering is the bind of binds that shows path in the jail (the path
// itself, or a directory above it), as package isolate binds them, or "".
func covering(binds []string, path string) string {
	for _, d := range binds {
		if path == d || strings.HasPrefix(path, d+"/") {
			return d
		}
	}
	return ""
}
