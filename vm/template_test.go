package vm

import "testing"

func TestTemplateKey(t *testing.T) {
	base := TemplateMeta{ImageDigest: "i", KernelDigest: "k", InitrdDigest: "r", MemoryMiB: 512, CPUs: 1, Accel: AccelTCG, QEMUVersion: "q"}
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
