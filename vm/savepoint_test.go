package vm

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	saved := SavePointMeta{Format: savePointFormat, ImageDigest: strings.Repeat("b", 64), KernelDigest: strings.Repeat("k", 64),
		InitrdDigest: strings.Repeat("i", 64), MemoryMiB: 512, CPUs: 1, Accel: AccelTCG, QEMUVersion: "QEMU emulator version 7.2.99", Launch: templateFormat}
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
