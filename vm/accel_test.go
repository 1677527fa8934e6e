package vm

import (
	"os"
	"path/filepath"
	"testing"
)

// TestProbeCache: a KVM probe result is reused only on the same boot of
// the host, with the same QEMU and kernel; anything else probes again.
func TestProbeCache(t *testing.T) {
	dir := t.TempDir()
	host := probeHost{BootID: "b1", QEMU: "/usr/bin/qemu-system-x86_64", QEMUSize: 10, QEMUMtime: 20, Kernel: "/img/vmlinuz", KernelSize: 30}
	if _, ok := readProbeCache(dir, host); ok {
		t.Fatal("a result before any probe")
	}
	if err := writeProbeCache(dir, host, probeResult{AccelTCG, "probe guest did not reach userspace within 15s"}); err != nil {
		t.Fatal(err)
	}
	rec, ok := readProbeCache(dir, host)
	if !ok || rec.Accel != AccelTCG || rec.Reason == "" || rec.ProbedAt.IsZero() {
		t.Fatalf("cached: %+v %v", rec, ok)
	}
	for name, change := range map[string]func(*probeHost){
		"reboot":       func(h *probeHost) { h.BootID = "b2" },
		"new qemu":     func(h *probeHost) { h.QEMUMtime++ },
		"other qemu":   func(h *probeHost) { h.QEMU = "/opt/qemu" },
		"other kernel": func(h *probeHost) { h.KernelSize++ },
		"no boot id":   func(h *probeHost) { h.BootID = "" },
	} {
		h := host
		change(&h)
		if _, ok := readProbeCache(dir, h); ok {
			t.Errorf("%s: the old result was reused", name)
		}
	}
	if _, ok := readProbeCache("", host); ok {
		t.Error("no cache directory, yet a result")
	}
	if err := os.WriteFile(filepath.Join(dir, probeCacheFile), []byte(`{"boot_id":"b1","accel":"auto"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, ok := readProbeCache(dir, host); ok {
		t.Error("a damaged cache file was used")
	}
}
