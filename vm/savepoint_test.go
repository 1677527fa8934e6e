package vm

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/internal/integrity"
	"github.com/vmgate/vmgate/vm/image"
	"github.com/vmgate/vmgate/vm/netstack"
)

// TestSavePointMatches: a save point is restored only into the machine it
// was saved from. Each difference a restarted or upgraded daemon can meet
// (a rebuilt image, kernel or initramfs, another QEMU, another launch
// format or accelerator, another shape) is refused as ErrSavePointStale,
// naming what differs and both values.
func TestSavePointMatches(t *testing.T) {
	img := t.TempDir()
	man := image.Manifest{Artifacts: map[string]image.Artifact{
		image.BaseFile: {SHA256: strings.Repeat("b", 64)}, image.KernelFile: {SHA256: strings.Repeat("k", 64)}, image.InitrdFile: {SHA256: strings.Repeat("i", 64)}}}
	b, _ := json.Marshal(man)
	if err := os.WriteFile(filepath.Join(img, image.ManifestFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	qemu := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	if err := os.WriteFile(qemu, []byte("#!/bin/sh\necho 'QEMU emulator version 7.2.99'\necho 'Copyright'\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	opts := Options{Runtime: Runtime{QEMU: qemu}, ImageDir: img, MemoryMiB: 512, CPUs: 1}
	saved := SavePointMeta{Format: savePointFormat, Machine: Machine{ImageDigest: strings.Repeat("b", 64), KernelDigest: strings.Repeat("k", 64),
		InitrdDigest: strings.Repeat("i", 64), MemoryMiB: 512, CPUs: 1, Accel: AccelTCG, QEMUVersion: "QEMU emulator version 7.2.99"}, Launch: templateFormat}
	if err := (&SavePoint{Meta: saved}).Matches(opts, AccelTCG); err != nil {
		t.Fatalf("the machine it was saved from: %v", err)
	}
	for _, tc := range []struct {
		want   string
		change func(*SavePointMeta, *Options) Accel
	}{
		{"image was aaaaaaaaaaaa, is bbbbbbbbbbbb", func(m *SavePointMeta, _ *Options) Accel { m.ImageDigest = strings.Repeat("a", 64); return AccelTCG }},
		{"kernel was", func(m *SavePointMeta, _ *Options) Accel { m.KernelDigest = "x"; return AccelTCG }},
		{"initramfs was", func(m *SavePointMeta, _ *Options) Accel { m.InitrdDigest = "x"; return AccelTCG }},
		{"QEMU was QEMU emulator version 7.2.0, is QEMU emulator version 7.2.99", func(m *SavePointMeta, _ *Options) Accel {
			m.QEMUVersion = "QEMU emulator version 7.2.0"
			return AccelTCG
		}},
		{"the VM's launch (vmgated's version) was", func(m *SavePointMeta, _ *Options) Accel { m.Launch--; return AccelTCG }},
		{"accelerator was tcg, is kvm", func(*SavePointMeta, *Options) Accel { return AccelKVM }},
		{"memory (MiB) was 512, is 1024", func(_ *SavePointMeta, o *Options) Accel { o.MemoryMiB = 1024; return AccelTCG }},
		{"CPUs was 1, is 2", func(_ *SavePointMeta, o *Options) Accel { o.CPUs = 2; return AccelTCG }},
		{"network was false, is true", func(_ *SavePointMeta, o *Options) Accel { o.Network = &netstack.Config{}; return AccelTCG }},
	} {
		m, o := saved, opts
		accel := tc.change(&m, &o)
		err := (&SavePoint{Meta: m}).Matches(o, accel)
		if !errors.Is(err, ErrSavePointStale) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v", tc.want, err)
		}
	}
}

// TestCopyRAMImage: the RAM image copy that resumes and resumed VMs'
// saves make, its digest and keyed check taken beside it. The copy holds
// src's data pages at their offsets and no zero page (a memory file stays
// unwritten there, a file keeps a hole), the digest and the check are
// src's as one pass computes them, and a write that fails ends the copy
// with its error, without waiting for the rest.
func TestCopyRAMImage(t *testing.T) {
	const page = integrity.PageSize
	const size = 64 << 20
	dir := t.TempDir()
	srcPath := filepath.Join(dir, "ram")
	src, err := os.Create(srcPath)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	// Runs of data pages across the 1 MiB reads, a zero page inside a
	// data extent, and holes between.
	rnd := rand.New(rand.NewPCG(1, 2))
	want := make([]byte, size)
	for _, r := range []struct{ off, n int64 }{{0, 3}, {255, 3}, {1024, 600}, {9000, 1}, {size/page - 2, 2}} {
		b := want[r.off*page : (r.off+r.n)*page]
		for i := range b {
			b[i] = byte(rnd.Uint32())
		}
		if _, err := src.WriteAt(b, r.off*page); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := src.WriteAt(make([]byte, page), 1100*page); err != nil { // zeros, written
		t.Fatal(err)
	}
	clear(want[1100*page : 1101*page])
	key := bytes.Repeat([]byte{7}, integrity.KeySize)
	serial := must(integrity.NewPageCheck(key, true))
	if err := serial.Add(0, want); err != nil {
		t.Fatal(err)
	}
	wantPages := int64(3 + 3 + 600 - 1 + 1 + 2)

	mem, err := memFile("test-ram", size)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	// The digest and the check beside each other, and both in one.
	sum, check := integrity.NewPageDigest(), must(integrity.NewPageCheck(key, false))
	both := must(integrity.NewPageCheck(key, true))
	pages, err := copyRAMImage(mem, src, sum, check, both)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Sum() != serial.Sum() || check.MAC() != serial.MAC() || both.Sum() != serial.Sum() || both.MAC() != serial.MAC() || pages != wantPages {
		t.Errorf("digest %s, check %s, both %s %s, %d pages; want %s, %s, %d", short(sum.Sum()), short(check.MAC()), short(both.Sum()), short(both.MAC()),
			pages, short(serial.Sum()), short(serial.MAC()), wantPages)
	}
	got := make([]byte, size)
	if _, err := mem.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the memory file's bytes differ from the image's")
	}

	// Into a file: the zero page stays a hole.
	out, err := os.Create(filepath.Join(dir, "copy"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := out.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := copyRAMImage(out, src); err != nil { // no digest: a fork point's
		t.Fatal(err)
	}
	if got, want := allocatedBytes(out.Name()), wantPages*page; got != want {
		t.Errorf("the copy allocates %d bytes, want %d (its data pages only)", got, want)
	}

	// A failing write.
	full := &failingWriter{after: 2}
	if _, err := copyRAMImage(full, src, integrity.NewPageDigest()); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("copy into a full disk: %v, want ENOSPC", err)
	}
}

// failingWriter fails with ENOSPC after its first writes.
type failingWriter struct{ after int }

func (w *failingWriter) WriteAt(p []byte, _ int64) (int, error) {
	if w.after == 0 {
		return 0, syscall.ENOSPC
	}
	w.after--
	return len(p), nil
}

// TestFillRAMDamaged: a resume's copy of a save point's RAM refuses a
// RAM file changed by one byte, a page zeroed, added or moved, or a file
// cut, as ErrSavePointDamaged: by its keyed check (format 3) and by its
// digest (format 2, saved by an older vmgated), whether it is checked as
// it is copied (a fork's shared copy) or after (a resume: fillRAM late,
// then verify). A check under another key refuses the intact file.
func TestFillRAMDamaged(t *testing.T) {
	const size = 8 << 20
	const page = integrity.PageSize
	ram := make([]byte, size)
	for i := range 300 * page {
		ram[i] = byte(i*7 + 1)
	}
	d := integrity.NewPageDigest()
	if err := d.Add(0, ram); err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte{9}, integrity.KeySize)
	c := must(integrity.NewPageCheck(key, false))
	if err := c.Add(0, ram); err != nil {
		t.Fatal(err)
	}
	base := SavePointMeta{Machine: Machine{MemoryMiB: size >> 20}, RAMSHA256: d.Sum()}
	keyed := base
	keyed.Format, keyed.CheckKey, keyed.RAMMAC = 3, hex.EncodeToString(key), c.MAC()
	otherKey := keyed
	otherKey.CheckKey = strings.Repeat("a", 2*integrity.KeySize)
	noKey := keyed
	noKey.CheckKey = ""
	old := base
	old.Format = 2
	for _, m := range []SavePointMeta{keyed, old} {
		fillDamaged(t, m, ram, false)
	}
	fillDamaged(t, otherKey, ram, true)
	fillDamaged(t, noKey, ram, true)
}

// fillDamaged fills a memory file from a save point of meta m whose RAM
// file is ram, intact (an error only if bad) and damaged in each way
// (ErrSavePointDamaged), checking the RAM as it is copied and after it.
func fillDamaged(t *testing.T, m SavePointMeta, ram []byte, bad bool) {
	t.Helper()
	const page = integrity.PageSize
	size := int64(len(ram))
	sp := &SavePoint{Dir: t.TempDir(), Meta: m}
	// An intact disk and state, for verify.
	key, _ := m.checkKey()
	for file, domain := range map[string]integrity.Domain{OverlayFile: integrity.DomainOverlay, TemplateStateFile: integrity.DomainState} {
		path := filepath.Join(sp.Dir, file)
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		sum, mac := must(integrity.ReaderSHA256(strings.NewReader(file))), ""
		if key != nil {
			sum, mac, _ = integrity.FileSums(path, key, domain)
		}
		if file == OverlayFile {
			sp.Meta.OverlaySHA256, sp.Meta.OverlayMAC = sum, mac
		} else {
			sp.Meta.StateSHA256, sp.Meta.StateMAC = sum, mac
		}
	}
	path := filepath.Join(sp.Dir, RAMFile)
	for name, damage := range map[string]func() error{
		"intact":        func() error { return nil },
		"one byte":      func() error { _, err := writeAt(path, []byte{0xff}, 100*page+5); return err },
		"a page zeroed": func() error { _, err := writeAt(path, make([]byte, page), 0); return err },
		"a page added":  func() error { _, err := writeAt(path, ram[:page], 1000*page); return err },
		"a page moved": func() error {
			if _, err := writeAt(path, make([]byte, page), 299*page); err != nil {
				return err
			}
			_, err := writeAt(path, ram[299*page:300*page], 300*page)
			return err
		},
		"cut in half": func() error { return os.Truncate(path, size/2) },
	} {
		if err := os.WriteFile(path, ram, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := damage(); err != nil {
			t.Fatal(err)
		}
		for _, late := range []bool{false, true} {
			mem := must(memFile("test-ram", size))
			err := sp.fillRAM(mem, !late, late)
			mem.Close()
			if err == nil && late {
				err = sp.verify(true)
			}
			if name == "intact" && !bad {
				if err != nil {
					t.Errorf("format %d, %s, late %v: %v", m.Format, name, late, err)
				}
				continue
			}
			if !errors.Is(err, ErrSavePointDamaged) {
				t.Errorf("format %d, key %.8s, %s, late %v: %v, want ErrSavePointDamaged", m.Format, m.CheckKey, name, late, err)
			}
		}
	}
}

// TestVerifyFormats: a restore checks a save point's disk and state by
// their keyed checks (format 3) and, for one saved by an older vmgated, by
// their SHA-256 (format 2); a file changed is refused either way, naming
// it.
func TestVerifyFormats(t *testing.T) {
	key := bytes.Repeat([]byte{6}, integrity.KeySize)
	files := map[string][]byte{OverlayFile: bytes.Repeat([]byte("qcow"), 50000), TemplateStateFile: []byte("device state")}
	sums := func(file string, domain integrity.Domain) (string, string) {
		path := filepath.Join(t.TempDir(), file)
		if err := os.WriteFile(path, files[file], 0o600); err != nil {
			t.Fatal(err)
		}
		sum, mac, err := integrity.FileSums(path, key, domain)
		if err != nil {
			t.Fatal(err)
		}
		return sum, mac
	}
	oSum, oMAC := sums(OverlayFile, integrity.DomainOverlay)
	sSum, sMAC := sums(TemplateStateFile, integrity.DomainState)
	keyed := SavePointMeta{Format: 3, CheckKey: hex.EncodeToString(key), OverlaySHA256: "not checked", StateSHA256: "not checked", OverlayMAC: oMAC, StateMAC: sMAC}
	old := SavePointMeta{Format: 2, OverlaySHA256: oSum, StateSHA256: sSum}
	for _, m := range []SavePointMeta{keyed, old} {
		for _, damaged := range []string{"", OverlayFile, TemplateStateFile} {
			sp := &SavePoint{Dir: t.TempDir(), Meta: m}
			for file, b := range files {
				if file == damaged {
					b = append(bytes.Clone(b[:len(b)-1]), b[len(b)-1]^1)
				}
				if err := os.WriteFile(filepath.Join(sp.Dir, file), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := sp.verify(false)
			switch {
			case damaged == "" && err != nil:
				t.Errorf("format %d, intact: %v", m.Format, err)
			case damaged != "" && (!errors.Is(err, ErrSavePointDamaged) || !strings.Contains(err.Error(), damaged+" has changed")):
				t.Errorf("format %d, %s damaged: %v", m.Format, damaged, err)
			}
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func writeAt(path string, b []byte, off int64) (int, error) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.WriteAt(b, off)
}

// TestDropRAMFile: a resumed VM's save point cannot be restored from once
// DropRAMFile returns, and its RAM file is removed when the caller runs
// the removal, the rest of the save point kept.
func TestDropRAMFile(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{RAMFile, OverlayFile} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sp := &SavePoint{Dir: dir}
	remove := sp.DropRAMFile()
	if _, err := sp.Restore(t.Context(), Options{}, false); err == nil || !strings.Contains(err.Error(), "dropped") {
		t.Errorf("restore after DropRAMFile: %v, want refused", err)
	}
	if _, err := os.Stat(filepath.Join(dir, RAMFile)); err != nil {
		t.Errorf("RAM file before its removal: %v", err)
	}
	if err := remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, RAMFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("RAM file after the drop: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, OverlayFile)); err != nil {
		t.Errorf("the disk after the drop: %v", err)
	}
	// A second removal (the file gone) is no error.
	if err := remove(); err != nil {
		t.Errorf("second removal: %v", err)
	}
}
