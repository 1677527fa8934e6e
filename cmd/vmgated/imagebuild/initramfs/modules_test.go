package initramfs

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseModInfo(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want ModInfo
	}{
		{"empty", "", ModInfo{}},
		{
			"typical",
			"alias=fs-ext4\x00depends=jbd2,mbcache,crc16\x00retpoline=Y\x00name=ext4\x00vermagic=6.1.0-57-amd64 SMP preempt mod_unload modversions \x00",
			ModInfo{Name: "ext4", Depends: []string{"jbd2", "mbcache", "crc16"}, Vermagic: "6.1.0-57-amd64 SMP preempt mod_unload modversions "},
		},
		{"empty depends", "depends=\x00name=virtio_ring", ModInfo{Name: "virtio_ring"}},
		{"normalised", "name=crc32c-intel\x00depends=a-b,c_d", ModInfo{Name: "crc32c_intel", Depends: []string{"a_b", "c_d"}}},
		{"duplicate and blank depends", "depends=a,,a, b ,\x00depends=b,c", ModInfo{Depends: []string{"a", "b", "c"}}},
		{"padding NULs", "\x00\x00name=x\x00\x00\x00\x00depends=y\x00\x00", ModInfo{Name: "x", Depends: []string{"y"}}},
		{"no equals", "garbage\x00name=x", ModInfo{Name: "x"}},
		{"value with equals", "parm=a=b\x00name=x=y", ModInfo{Name: "x=y"}},
		{
			"softdep pre and post",
			"softdep=pre: a b-c post: d\x00softdep=pre: e",
			ModInfo{SoftPre: []string{"a", "b_c", "e"}, SoftPost: []string{"d"}},
		},
		{"softdep without section", "softdep=ecb\x00softdep=  hmac  pre:  x", ModInfo{SoftPre: []string{"x"}}},
		{"softdep unknown section", "softdep=pre: a platform: b post: c", ModInfo{SoftPre: []string{"a"}, SoftPost: []string{"c"}}},
		{"last name wins", "name=a\x00name=b", ModInfo{Name: "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ParseModInfo([]byte(tt.in)); !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("ParseModInfo(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestReadModInfo(t *testing.T) {
	dir := t.TempDir()
	writeModule(t, dir, "m.ko", "license=GPL", "depends=a,b", "softdep=pre: c", "name=m")
	got, err := ReadModInfo(filepath.Join(dir, "m.ko"))
	if err != nil {
		t.Fatal(err)
	}
	want := ModInfo{Name: "m", Depends: []string{"a", "b"}, SoftPre: []string{"c"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}

	noInfo := filepath.Join(dir, "noinfo.ko")
	if err := os.WriteFile(noInfo, rawELF(t, ".text", []byte{0xc3}), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadModInfo(noInfo); err == nil || !strings.Contains(err.Error(), "no .modinfo section") {
		t.Errorf("module without .modinfo: error %v", err)
	}
	notELF := filepath.Join(dir, "text.ko")
	if err := os.WriteFile(notELF, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadModInfo(notELF); err == nil {
		t.Error("non-ELF file: no error")
	}
	if _, err := ReadModInfo(filepath.Join(dir, "absent.ko")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent file: error %v, want ErrNotExist", err)
	}
}

func TestResolveModulesDiamond(t *testing.T) {
	root := t.TempDir()
	writeModule(t, root, "kernel/top.ko", "depends=left,right", "name=top")
	writeModule(t, root, "kernel/sub/left.ko", "depends=base", "name=left")
	writeModule(t, root, "kernel/sub/right.ko", "depends=base", "name=right")
	writeModule(t, root, "kernel/lib/base.ko", "depends=", "name=base")
	writeModule(t, root, "kernel/unrelated.ko", "depends=", "name=unrelated")
	if err := os.WriteFile(filepath.Join(root, "modules.order"), []byte("kernel/top.ko\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	mods, err := ResolveModules(root, []string{"top"})
	if err != nil {
		t.Fatal(err)
	}
	want := []Module{
		{Name: "base", RelPath: "kernel/lib/base.ko", Path: filepath.Join(root, "kernel/lib/base.ko")},
		{Name: "left", RelPath: "kernel/sub/left.ko", Path: filepath.Join(root, "kernel/sub/left.ko"), Depends: []string{"base"}},
		{Name: "right", RelPath: "kernel/sub/right.ko", Path: filepath.Join(root, "kernel/sub/right.ko"), Depends: []string{"base"}},
		{Name: "top", RelPath: "kernel/top.ko", Path: filepath.Join(root, "kernel/top.ko"), Depends: []string{"left", "right"}},
	}
	if !reflect.DeepEqual(mods, want) {
		t.Fatalf("got %+v\nwant %+v", mods, want)
	}

	// Wanting modules that are also dependencies, in any order, lists each
	// once, still after its dependencies.
	mods, err = ResolveModules(root, []string{"right", "top", "base", "right"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(mods), []string{"base", "right", "left", "top"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestResolveModulesRelativeRoot(t *testing.T) {
	root := t.TempDir()
	writeModule(t, root, "a.ko", "name=a")
	t.Chdir(root)
	mods, err := ResolveModules(".", []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) != 1 || !filepath.IsAbs(mods[0].Path) || mods[0].RelPath != "a.ko" {
		t.Fatalf("got %+v", mods)
	}
}

func TestResolveModulesMissingHardDependency(t *testing.T) {
	root := t.TempDir()
	writeModule(t, root, "a.ko", "depends=gone1,c", "name=a")
	writeModule(t, root, "b.ko", "depends=gone2,gone1", "name=b")
	writeModule(t, root, "c.ko", "name=c")
	_, err := ResolveModules(root, []string{"a", "b", "nosuch"})
	if !errors.Is(err, ErrModuleNotFound) {
		t.Fatalf("error %v, want ErrModuleNotFound", err)
	}
	for _, s := range []string{"nosuch (wanted)", "gone1 (needed by a, b)", "gone2 (needed by b)"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func TestResolveModulesCompressedHint(t *testing.T) {
	root := t.TempDir()
	writeModule(t, root, "a.ko", "depends=zipped", "name=a")
	if err := os.WriteFile(filepath.Join(root, "zipped.ko.xz"), []byte("xz"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ResolveModules(root, []string{"a"})
	if !errors.Is(err, ErrModuleNotFound) || !strings.Contains(err.Error(), "compressed") {
		t.Fatalf("error %v, want a not-found error mentioning compression", err)
	}
}

func TestResolveModulesSoftDeps(t *testing.T) {
	root := t.TempDir()
	// a: missing softdeps (an alias, a post dependency) are ignored; the
	// existing pre one is loaded first.
	writeModule(t, root, "a.ko", "softdep=pre: crypto-crc32c s post: p-missing", "depends=h", "name=a")
	writeModule(t, root, "s.ko", "name=s")
	writeModule(t, root, "h.ko", "name=h")
	mods, err := ResolveModules(root, []string{"a"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(mods), []string{"s", "h", "a"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestResolveModulesSoftDepCycle(t *testing.T) {
	root := t.TempDir()
	// x wants y loaded first, but y needs x: the soft edge gives way and y
	// is still part of the result, after x.
	writeModule(t, root, "x.ko", "softdep=pre: y", "name=x")
	writeModule(t, root, "y.ko", "depends=x", "name=y")
	// Two modules that softdep on each other, and one on itself.
	writeModule(t, root, "p.ko", "softdep=pre: q p", "name=p")
	writeModule(t, root, "q.ko", "softdep=pre: p", "name=q")
	mods, err := ResolveModules(root, []string{"x", "p"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(mods), []string{"x", "q", "p", "y"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestResolveModulesNormalisation(t *testing.T) {
	root := t.TempDir()
	writeModule(t, root, "kernel/arch/crc32c-intel.ko", "depends=crc32c_generic", "name=crc32c_intel")
	writeModule(t, root, "kernel/crypto/crc32c_generic.ko", "depends=", "name=crc32c_generic")
	writeModule(t, root, "kernel/virtio-rng.ko", "depends=hw-random_core", "name=virtio_rng")
	writeModule(t, root, "kernel/hw_random-core.ko", "name=hw_random_core")
	mods, err := ResolveModules(root, []string{"crc32c-intel", "virtio_rng"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(mods), []string{"crc32c_generic", "crc32c_intel", "hw_random_core", "virtio_rng"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	if mods[1].RelPath != "kernel/arch/crc32c-intel.ko" || mods[3].RelPath != "kernel/virtio-rng.ko" {
		t.Fatalf("paths %+v", mods)
	}
}

func TestResolveModulesCycle(t *testing.T) {
	root := t.TempDir()
	writeModule(t, root, "a.ko", "depends=b", "name=a")
	writeModule(t, root, "b.ko", "depends=c", "name=b")
	writeModule(t, root, "c.ko", "depends=a", "name=c")
	writeModule(t, root, "self.ko", "depends=self", "name=self")
	_, err := ResolveModules(root, []string{"a"})
	if !errors.Is(err, ErrDependencyCycle) || !strings.Contains(err.Error(), "a -> b -> c -> a") {
		t.Fatalf("error %v, want cycle a -> b -> c -> a", err)
	}
	_, err = ResolveModules(root, []string{"self"})
	if !errors.Is(err, ErrDependencyCycle) || !strings.Contains(err.Error(), "self -> self") {
		t.Fatalf("error %v, want cycle self -> self", err)
	}
}

func TestResolveModulesBadTree(t *testing.T) {
	root := t.TempDir()
	writeModule(t, root, "kernel/dup.ko", "name=dup")
	writeModule(t, root, "updates/dup.ko", "name=dup")
	writeModule(t, root, "liar.ko", "name=other")
	if _, err := ResolveModules(root, []string{"dup"}); err == nil || !strings.Contains(err.Error(), "several files") {
		t.Errorf("duplicate module: error %v", err)
	}
	if _, err := ResolveModules(root, []string{"liar"}); err == nil || !strings.Contains(err.Error(), `declares name "other"`) {
		t.Errorf("name mismatch: error %v", err)
	}
	if _, err := ResolveModules(filepath.Join(root, "absent"), []string{"x"}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent root: error %v", err)
	}
}

func FuzzParseModInfo(f *testing.F) {
	f.Add([]byte("depends=jbd2,mbcache,crc16\x00name=ext4\x00softdep=pre: crypto-crc32c\x00"))
	f.Add([]byte("softdep=pre: a post: b c\x00depends=,,\x00"))
	f.Add([]byte("name=\x00=\x00\x00"))
	f.Fuzz(func(t *testing.T, data []byte) {
		mi := ParseModInfo(data)
		for _, list := range [][]string{mi.Depends, mi.SoftPre, mi.SoftPost} {
			seen := make(map[string]bool)
			for _, n := range list {
				if n == "" || strings.Contains(n, "-") || seen[n] {
					t.Fatalf("bad name %q in %q", n, list)
				}
				seen[n] = true
			}
		}
		if strings.Contains(mi.Name, "-") {
			t.Fatalf("name %q not normalised", mi.Name)
		}
	})
}

func FuzzModInfoELF(f *testing.F) {
	f.Add(fakeELF(f, "depends=a,b", "name=c"))
	f.Add(rawELF(f, ".text", []byte{0xc3}))
	f.Add([]byte("\x7fELF"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		_, _ = modInfoFromELF(ef)
	})
}
