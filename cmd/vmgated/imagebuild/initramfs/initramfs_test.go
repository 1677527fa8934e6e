package initramfs

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestBuild(t *testing.T) {
	dir := t.TempDir()
	writeFile := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	mods := []Module{
		{Name: "virtio_ring", Path: writeFile("ring.ko", "ring module")},
		{Name: "virtio-rng", Path: writeFile("rng.ko", "rng")},
	}
	initBin := []byte("\x7fELF fake init")

	var buf bytes.Buffer
	if err := Build(&buf, initBin, mods); err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{Name: "dev", Mode: fs.ModeDir | 0o755},
		{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, DevMajor: 5, DevMinor: 1},
		{Name: "dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666, DevMajor: 1, DevMinor: 3},
		{Name: "proc", Mode: fs.ModeDir | 0o555},
		{Name: "sys", Mode: fs.ModeDir | 0o555},
		{Name: "root", Mode: fs.ModeDir | 0o755},
		{Name: "modules", Mode: fs.ModeDir | 0o755},
		{Name: "init", Mode: 0o755, Data: initBin},
		{Name: "modules/virtio_ring.ko", Mode: 0o644, Data: []byte("ring module")},
		{Name: "modules/virtio_rng.ko", Mode: 0o644, Data: []byte("rng")},
		{Name: "modules/order", Mode: 0o644, Data: []byte("virtio_ring.ko\nvirtio_rng.ko\n")},
	}
	if got := readEntries(t, buf.Bytes()); !reflect.DeepEqual(got, want) {
		t.Fatalf("archive entries:\n got %+v\nwant %+v", got, want)
	}

	var again bytes.Buffer
	if err := Build(&again, initBin, mods); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatal("Build is not deterministic")
	}
}

func TestBuildNoModules(t *testing.T) {
	var buf bytes.Buffer
	if err := Build(&buf, []byte("init"), nil); err != nil {
		t.Fatal(err)
	}
	got := readEntries(t, buf.Bytes())
	last := got[len(got)-1]
	if last.Name != ModuleOrderPath || len(last.Data) != 0 {
		t.Fatalf("last entry %+v, want an empty %s", last, ModuleOrderPath)
	}
}

func TestBuildErrors(t *testing.T) {
	dir := t.TempDir()
	ko := filepath.Join(dir, "a.ko")
	if err := os.WriteFile(ko, []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		init []byte
		mods []Module
		msg  string
	}{
		{"empty init", nil, nil, "empty init binary"},
		{"duplicate module", []byte("i"), []Module{{Name: "a-b", Path: ko}, {Name: "a_b", Path: ko}}, "listed twice"},
		{"missing file", []byte("i"), []Module{{Name: "gone", Path: filepath.Join(dir, "gone.ko")}}, "read module gone"},
		{"slash in name", []byte("i"), []Module{{Name: "x/y", Path: ko}}, "invalid module name"},
		{"empty name", []byte("i"), []Module{{Path: ko}}, "invalid module name"},
		{"newline in name", []byte("i"), []Module{{Name: "x\ny", Path: ko}}, "invalid module name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := Build(&buf, tt.init, tt.mods)
			if err == nil || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("error %v, want one mentioning %q", err, tt.msg)
			}
			if buf.Len() != 0 {
				t.Fatalf("%d bytes written despite the error", buf.Len())
			}
		})
	}
}

// realModulesRoot returns a lib/modules/<version> directory of a real Debian
// kernel: $VMGATE_TEST_MODULES_ROOT if set, else one unpacked from
// $VMGATE_TEST_KERNEL_DEB or /tmp/linux-image-6.1.0-*-amd64_*.deb. It skips
// the test when neither is available.
func realModulesRoot(t *testing.T) string {
	t.Helper()
	if root := os.Getenv("VMGATE_TEST_MODULES_ROOT"); root != "" {
		return root
	}
	if testing.Short() {
		t.Skip("unpacking a kernel package is skipped in -short mode")
	}
	deb := os.Getenv("VMGATE_TEST_KERNEL_DEB")
	if deb == "" {
		matches, _ := filepath.Glob("/tmp/linux-image-6.1.0-*-amd64_*_amd64.deb")
		if len(matches) == 0 {
			t.Skip("no kernel package; set VMGATE_TEST_KERNEL_DEB or VMGATE_TEST_MODULES_ROOT")
		}
		deb = matches[len(matches)-1]
	}
	dpkgDeb, err := exec.LookPath("dpkg-deb")
	if err != nil {
		t.Skip("dpkg-deb not installed")
	}
	dir := t.TempDir()
	if out, err := exec.Command(dpkgDeb, "-x", deb, dir).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v\n%s", deb, err, out)
	}
	roots, _ := filepath.Glob(filepath.Join(dir, "lib/modules/*"))
	if len(roots) != 1 {
		t.Fatalf("want one lib/modules/<version> in %s, found %v", deb, roots)
	}
	return roots[0]
}

func TestResolveRealDebianModules(t *testing.T) {
	root := realModulesRoot(t)
	want := []string{"virtio_mmio", "virtio_blk", "virtio_console", "virtio_net", "virtio_rng", "ext4", "crc32c_generic"}
	mods, err := ResolveModules(root, want)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("load order: %v", names(mods))

	pos := make(map[string]int)
	for i, m := range mods {
		if _, dup := pos[m.Name]; dup {
			t.Errorf("module %s listed twice", m.Name)
		}
		pos[m.Name] = i
		for _, d := range m.Depends {
			if j, ok := pos[d]; !ok || j >= i {
				t.Errorf("module %s comes before its dependency %s", m.Name, d)
			}
		}
		if _, err := os.Stat(m.Path); err != nil {
			t.Errorf("module %s: %v", m.Name, err)
		}
	}
	for _, w := range want {
		indexOf(t, mods, w)
	}
	before := func(first, then string) {
		if indexOf(t, mods, first) >= indexOf(t, mods, then) {
			t.Errorf("%s must come before %s in %v", first, then, names(mods))
		}
	}
	for _, d := range []string{"jbd2", "mbcache", "crc16"} {
		before(d, "ext4")
	}
	before("virtio", "virtio_mmio")
	before("virtio_ring", "virtio_mmio")
	before("virtio_ring", "virtio")
	if m := mods[indexOf(t, mods, "virtio_rng")]; m.RelPath != "kernel/drivers/char/hw_random/virtio-rng.ko" {
		t.Errorf("virtio_rng path %s", m.RelPath)
	}

	var buf bytes.Buffer
	if err := Build(&buf, []byte("init"), mods); err != nil {
		t.Fatal(err)
	}
	entries := readEntries(t, buf.Bytes())
	order := entries[len(entries)-1]
	var wantOrder strings.Builder
	for _, m := range mods {
		wantOrder.WriteString(m.Name + ".ko\n")
	}
	if order.Name != ModuleOrderPath || string(order.Data) != wantOrder.String() {
		t.Fatalf("order file %q = %q, want %q", order.Name, order.Data, wantOrder.String())
	}
}
