package vm

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
)

func TestTemplateKey(t *testing.T) {
	base := TemplateMeta{Machine: Machine{ImageDigest: "i", KernelDigest: "k", InitrdDigest: "r", MemoryMiB: 512, CPUs: 1, Accel: AccelTCG, QEMUVersion: "q"}}
	k0 := templateKey(base)
	if len(k0) != 16 || templateKey(base) != k0 {
		t.Fatalf("key %q not stable", k0)
	}
	for name, mod := range map[string]func(*TemplateMeta){
		"image":  func(m *TemplateMeta) { m.ImageDigest = "i2" },
		"kernel": func(m *TemplateMeta) { m.KernelDigest = "k2" },
		"initrd": func(m *TemplateMeta) { m.InitrdDigest = "r2" },
		"memory": func(m *TemplateMeta) { m.MemoryMiB = 1024 },
		"cpus":   func(m *TemplateMeta) { m.CPUs = 2 },
		"disk":   func(m *TemplateMeta) { m.DiskMiB = 2048 },
		"accel":  func(m *TemplateMeta) { m.Accel = AccelKVM },
		"qemu":   func(m *TemplateMeta) { m.QEMUVersion = "q2" },
		"nic":    func(m *TemplateMeta) { m.Network = true },
	} {
		m := base
		mod(&m)
		if templateKey(m) == k0 {
			t.Errorf("changing the %s keeps the key", name)
		}
	}
	// What is measured while building is not part of the key.
	m := base
	m.BootMillis, m.StateBytes, m.RAMSHA256 = 5, 6, "x"
	if templateKey(m) != k0 {
		t.Error("build measurements change the key")
	}
}

// TestRemoveStaleTemplates: stale templates of the same shape and leftover
// builds go, unless another holder of their key's lock is using them;
// other shapes' templates stay.
func TestRemoveStaleTemplates(t *testing.T) {
	root := t.TempDir()
	mk := func(key string, mem, disk int, network bool) string {
		d := filepath.Join(root, key)
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		m := TemplateMeta{Format: templateFormat, Key: key, Machine: Machine{MemoryMiB: mem, CPUs: 1, Network: network}, DiskMiB: disk}
		b, _ := json.Marshal(m)
		for _, f := range []string{OverlayFile, RAMFile, TemplateStateFile} {
			if err := os.WriteFile(filepath.Join(d, f), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(d, TemplateMetaFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return d
	}
	keep := mk("aaaa", 512, 1024, false)
	stale := mk("bbbb", 512, 1024, false)
	busy := mk("cccc", 512, 1024, false)
	nic := mk("dddd", 512, 1024, true)
	other := mk("eeee", 1024, 1024, false)
	disk := mk("gggg", 512, 64, false)
	leftover := filepath.Join(root, buildDirPrefix+"aaaa-123")
	busyBuild := filepath.Join(root, buildDirPrefix+"ffff-456")
	for _, d := range []string{leftover, busyBuild} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range []string{"cccc", "ffff"} {
		l, err := lockKey(root, k, false)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	if err := removeStaleTemplates(root, TemplateMeta{Key: "aaaa", Machine: Machine{MemoryMiB: 512, CPUs: 1}, DiskMiB: 1024}); err != nil {
		t.Fatal(err)
	}
	for d, want := range map[string]bool{keep: true, stale: false, busy: true, nic: true, other: true, disk: true, leftover: false, busyBuild: true} {
		_, err := os.Stat(d)
		if got := err == nil; got != want {
			t.Errorf("%s: exists %v, want %v", filepath.Base(d), got, want)
		}
	}
}

// TestMoveFileAcrossFilesystems moves a sparse file from the test's
// directory to a tmpfs: the content arrives whole and the holes stay
// holes.
func TestMoveFileAcrossFilesystems(t *testing.T) {
	mnt := testutil.Tmpfs(t, "64m")
	src := filepath.Join(t.TempDir(), "ram")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	const size = 48 << 20
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("vmgate"), 100_000)
	for _, off := range []int64{0, 5 << 20, size - int64(len(chunk))} {
		if _, err := f.WriteAt(chunk, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	want, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(mnt, "ram")
	if err := moveFile(src, dst); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(src); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("source left: %v", err)
	}
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("content differs (%v)", err)
	}
	if a := allocatedBytes(dst); a > 4<<20 {
		t.Errorf("%d bytes allocated for 1.8 MB of data in 48 MiB: holes were filled", a)
	}
}
