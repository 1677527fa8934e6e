package vm

import (
	"encoding/json"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// The metadata files as vmgated wrote them before Machine was one type
// embedded in both: their keys and values must read the same, and be
// written the same.
const (
	templateJSON = `{
  "format": 6,
  "key": "0123456789abcdef",
  "image_digest": "b1",
  "kernel_digest": "k1",
  "initrd_digest": "i1",
  "memory_mib": 512,
  "cpus": 1,
  "disk_mib": 1024,
  "accel": "tcg",
  "qemu_version": "QEMU emulator version 7.2.15",
  "network": true,
  "guest_aslr": false,
  "built_at": "2026-12-05T12:00:00Z",
  "boot_ms": 20000,
  "save_ms": 900,
  "state_bytes": 61234,
  "ram_data_bytes": 262144000,
  "overlay_sha256": "o1",
  "state_sha256": "s1",
  "ram_sha256": "r1"
}`
	savePointJSON = `{
  "format": 3,
  "image_digest": "b1",
  "kernel_digest": "k1",
  "initrd_digest": "i1",
  "memory_mib": 512,
  "cpus": 2,
  "accel": "kvm",
  "qemu_version": "QEMU emulator version 7.2.15",
  "network": true,
  "launch_format": 6,
  "saved_at": "2026-12-05T12:00:00Z",
  "phases": [
    {
      "name": "stop",
      "ns": 3000000
    }
  ],
  "overlay_sha256": "o1",
  "state_sha256": "s1",
  "ram_sha256": "r1",
  "overlay_bytes": 1048576,
  "state_bytes": 61234,
  "ram_data_bytes": 104857600,
  "check_key": "c1",
  "overlay_mac": "om",
  "state_mac": "sm",
  "ram_mac": "rm"
}`
)

// TestMetaFiles: template.json and savepoint.json as vmgated wrote them
// before the machine was one type decode into the same values, and are
// written with the same keys and values (a save point's byte for byte;
// a template's disk_mib now follows the machine's fields).
func TestMetaFiles(t *testing.T) {
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	machine := Machine{ImageDigest: "b1", KernelDigest: "k1", InitrdDigest: "i1", MemoryMiB: 512, CPUs: 1, Accel: AccelTCG,
		QEMUVersion: "QEMU emulator version 7.2.15", Network: true}
	wantT := TemplateMeta{Format: 6, Key: "0123456789abcdef", Machine: machine, DiskMiB: 1024, BuiltAt: at, BootMillis: 20000, SaveMillis: 900,
		StateBytes: 61234, RAMDataBytes: 250 << 20, OverlaySHA256: "o1", StateSHA256: "s1", RAMSHA256: "r1"}
	machine.CPUs, machine.Accel = 2, AccelKVM
	wantS := SavePointMeta{Format: 3, Machine: machine, Launch: 6, SavedAt: at, Phases: []Phase{{"stop", 3 * time.Millisecond}},
		OverlaySHA256: "o1", StateSHA256: "s1", RAMSHA256: "r1", OverlayBytes: 1 << 20, StateBytes: 61234, RAMDataBytes: 100 << 20,
		CheckKey: "c1", OverlayMAC: "om", StateMAC: "sm", RAMMAC: "rm"}
	for _, c := range []struct {
		name, file string
		got, want  any
		sameBytes  bool
	}{
		{TemplateMetaFile, templateJSON, &TemplateMeta{}, &wantT, false},
		{SavePointMetaFile, savePointJSON, &SavePointMeta{}, &wantS, true},
	} {
		if err := json.Unmarshal([]byte(c.file), c.got); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s decodes as\n%+v\nwant\n%+v", c.name, c.got, c.want)
		}
		b, err := json.MarshalIndent(c.want, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		var was, now map[string]any
		if err := json.Unmarshal([]byte(c.file), &was); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &now); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(was, now) {
			t.Errorf("%s is written with keys %q, was %q:\n%s", c.name, slices.Sorted(maps.Keys(now)), slices.Sorted(maps.Keys(was)), b)
		}
		if c.sameBytes && string(b) != c.file {
			t.Errorf("%s is written as\n%s\nwas\n%s", c.name, b, c.file)
		}
	}
}

// TestMachineDiff: the difference named is the first of the machine's
// properties that changed, with both values (digests shortened); one
// machine has none.
func TestMachineDiff(t *testing.T) {
	m := Machine{ImageDigest: strings.Repeat("a", 64), KernelDigest: "k", InitrdDigest: "i", MemoryMiB: 512, CPUs: 1, Accel: AccelTCG, QEMUVersion: "q", Network: false}
	if d := m.diff(m); d != "" {
		t.Errorf("one machine: %q", d)
	}
	for _, c := range []struct {
		change func(*Machine)
		want   string
	}{
		{func(n *Machine) { n.ImageDigest = strings.Repeat("b", 64) }, "image was aaaaaaaaaaaa, is bbbbbbbbbbbb"},
		{func(n *Machine) { n.KernelDigest = "k2" }, "kernel was k, is k2"},
		{func(n *Machine) { n.InitrdDigest = "i2" }, "initramfs was i, is i2"},
		{func(n *Machine) { n.QEMUVersion = "q2" }, "QEMU was q, is q2"},
		{func(n *Machine) { n.Accel = AccelKVM }, "accelerator was tcg, is kvm"},
		{func(n *Machine) { n.MemoryMiB = 1024 }, "memory (MiB) was 512, is 1024"},
		{func(n *Machine) { n.CPUs = 2 }, "CPUs was 1, is 2"},
		{func(n *Machine) { n.Network = true }, "network was false, is true"},
		// Two differences: the first is named.
		{func(n *Machine) { n.CPUs, n.KernelDigest = 2, "k2" }, "kernel was k, is k2"},
	} {
		n := m
		c.change(&n)
		if d := m.diff(n); d != c.want {
			t.Errorf("diff %q, want %q", d, c.want)
		}
	}
}

// TestTemplateMatches: a template found under the key wanted is refused
// when its machine is not the one wanted (named by Machine.diff), or when
// its key is another.
func TestTemplateMatches(t *testing.T) {
	want := TemplateMeta{Format: templateFormat, Machine: Machine{ImageDigest: "b", MemoryMiB: 512, CPUs: 1, Accel: AccelTCG}, DiskMiB: 1024}
	want.Key = templateKey(want)
	if err := want.matches(want); err != nil {
		t.Errorf("the template wanted: %v", err)
	}
	other := want
	other.MemoryMiB = 1024
	if err := other.matches(want); err == nil || err.Error() != "memory (MiB) was 1024, is 512" {
		t.Errorf("another memory: %v", err)
	}
	other = want
	other.Key = "0000000000000000"
	if err := other.matches(want); err == nil || !strings.Contains(err.Error(), "key 0000000000000000 does not match") {
		t.Errorf("another key: %v", err)
	}
}
