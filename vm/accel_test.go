package vm

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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

// fakeSys makes a /sys with the named modules loaded.
func fakeSys(t *testing.T, modules ...string) string {
	t.Helper()
	sys := t.TempDir()
	for _, m := range modules {
		if err := os.MkdirAll(filepath.Join(sys, "module", m), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return sys
}

// TestPVMKVM: KVM is the PVM hypervisor when its module is loaded and no
// hardware KVM module is.
func TestPVMKVM(t *testing.T) {
	for _, tc := range []struct {
		modules []string
		want    bool
	}{
		{nil, false},
		{[]string{"kvm", "kvm_intel"}, false},
		{[]string{"kvm", "kvm_amd"}, false},
		{[]string{"kvm", "kvm_pvm"}, true},
		{[]string{"kvm_pvm"}, true},
		{[]string{"kvm", "kvm_pvm", "kvm_intel"}, false},
		{[]string{"kvm", "kvm_pvmx"}, false},
	} {
		if got := pvmKVM(os.DirFS(fakeSys(t, tc.modules...))); got != tc.want {
			t.Errorf("modules %v: pvmKVM = %v, want %v", tc.modules, got, tc.want)
		}
	}
	// A file where the module's directory would be is not a module.
	sys := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sys, "module"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "module/kvm_pvm"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if pvmKVM(os.DirFS(sys)) {
		t.Error("a file named kvm_pvm is a loaded module")
	}
}

// TestResolveAccelPVM: on a PVM host, auto is TCG without a probe (no
// QEMU started, no probe result kept), with one log line that says why.
func TestResolveAccelPVM(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	cacheDir := t.TempDir()
	kernel := filepath.Join(t.TempDir(), "vmlinuz-pvm-test") // a probe key no other test uses
	a, err := resolveAccel(t.Context(), AccelAuto, "qemu-system-x86_64", kernel, kernel, cacheDir, os.DirFS(fakeSys(t, "kvm", "kvm_pvm")), log)
	if err != nil || a != AccelTCG {
		t.Fatalf("resolveAccel: %v, %v; want tcg", a, err)
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "a PVM guest kernel would be needed") || !strings.Contains(lines[0], "using TCG") {
		t.Errorf("log:\n%s\nwant one line saying a PVM guest kernel would be needed and TCG is used", logs.String())
	}
	if ents, _ := os.ReadDir(cacheDir); len(ents) != 0 {
		t.Errorf("a probe ran: %v", ents)
	}
}
