package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/internal/durable"
)

// ProbeTimeout bounds the KVM probe. A working KVM boots the probe kernel to
// its initramfs in well under a second; hosts where /dev/kvm opens but
// guests hang (nested virtualisation gone wrong) are caught by this bound.
var ProbeTimeout = 15 * time.Second

type probeKey struct{ qemu, kernel string }

var (
	probeMu    sync.Mutex
	probeCache = map[probeKey]probeResult{}
)

type probeResult struct {
	accel  Accel
	reason string
}

// ResolveAccel turns a configured accelerator into the one to use.
// kvm and tcg are taken as given (kvm fails if /dev/kvm cannot be opened);
// auto opens /dev/kvm and boots the image's kernel under KVM with a bounded
// timeout, falling back to TCG with a logged reason. The auto result is
// cached for the life of the process, and, with a cacheDir, on disk for the
// rest of the host's boot (see readProbeCache): on a host whose /dev/kvm
// hangs, the probe costs its full timeout, which a daemon start should not
// pay again and again.
//
// A host whose KVM is the nested PVM hypervisor (pvmKVM) is not probed:
// a stock guest kernel cannot run under it (QEMU fails at once, with an
// assertion dump), so auto is TCG there, said in one line.
func ResolveAccel(ctx context.Context, want Accel, qemu, kernel, initrd, cacheDir string, log *slog.Logger) (Accel, error) {
	return resolveAccel(ctx, want, qemu, kernel, initrd, cacheDir, os.DirFS("/sys"), log)
}

// resolveAccel is ResolveAccel, with sys as the host's /sys.
func resolveAccel(ctx context.Context, want Accel, qemu, kernel, initrd, cacheDir string, sys fs.FS, log *slog.Logger) (Accel, error) {
	if log == nil {
		log = slog.Default()
	}
	switch want {
	case AccelTCG:
		return AccelTCG, nil
	case AccelKVM:
		if err := openKVM(); err != nil {
			return "", fmt.Errorf("accel kvm: %w", err)
		}
		return AccelKVM, nil
	case AccelAuto, "":
	default:
		return "", fmt.Errorf("accelerator %q: want auto, kvm or tcg", want)
	}
	key := probeKey{qemu, kernel}
	probeMu.Lock()
	defer probeMu.Unlock()
	if r, ok := probeCache[key]; ok {
		return r.accel, nil
	}
	if pvmKVM(sys) {
		log.Warn("KVM here is the nested PVM hypervisor (" + pvmModule + "): the image's stock kernel cannot run under it, a PVM guest kernel would be needed; using TCG (slower; QEMU's TCG is not a security boundary, the jail is)")
		probeCache[key] = probeResult{AccelTCG, "KVM is the PVM hypervisor"}
		return AccelTCG, nil
	}
	host := currentProbeHost(qemu, kernel)
	if rec, ok := readProbeCache(cacheDir, host); ok {
		log.Info("accelerator from this boot's KVM probe", "accel", rec.Accel, "reason", rec.Reason, "probed_at", rec.ProbedAt, "cache", filepath.Join(cacheDir, probeCacheFile))
		r := probeResult{rec.Accel, rec.Reason}
		probeCache[key] = r
		return r.accel, nil
	}
	r := probeKVM(ctx, qemu, kernel, initrd)
	if ctx.Err() != nil {
		// A cancelled probe proves nothing: neither cached nor kept.
		return r.accel, nil
	}
	if r.accel == AccelTCG {
		log.Warn("KVM unusable, using TCG (slower; QEMU's TCG is not a security boundary, the jail is)", "reason", r.reason)
	} else {
		log.Info("KVM probe succeeded", "detail", r.reason)
	}
	probeCache[key] = r
	if err := writeProbeCache(cacheDir, host, r); err != nil {
		log.Warn("keep the KVM probe result", "err", err)
	}
	return r.accel, nil
}

// pvmModule is the kernel module of the PVM hypervisor ("Pagetable-based
// Virtual Machine": KVM for guests in a VM without nested
// virtualisation), as /sys shows it when loaded.
const pvmModule = "/sys/module/kvm_pvm"

// hardwareKVMModules are KVM's modules for hardware virtualisation.
var hardwareKVMModules = []string{"module/kvm_intel", "module/kvm_amd"}

// pvmKVM reports whether the KVM of the host whose /sys is sys is the PVM
// hypervisor: its module is loaded and no hardware KVM module is (with
// one of those too, which one /dev/kvm is is left to the probe). PVM runs
// only guest kernels built for it.
func pvmKVM(sys fs.FS) bool {
	loaded := func(m string) bool {
		fi, err := fs.Stat(sys, m)
		return err == nil && fi.IsDir()
	}
	if !loaded(strings.TrimPrefix(pvmModule, "/sys/")) {
		return false
	}
	return !slices.ContainsFunc(hardwareKVMModules, loaded)
}

// probeCacheFile holds the last KVM probe result in a cache directory.
const probeCacheFile = "accel-probe.json"

// probeRecord is a KVM probe result with the host it is valid for.
type probeRecord struct {
	probeHost
	Accel    Accel     `json:"accel"`
	Reason   string    `json:"reason"`
	ProbedAt time.Time `json:"probed_at"`
}

// probeHost is what a probe result depends on: this boot of the host
// (a reboot may load or fix KVM), the QEMU binary and the probed kernel.
type probeHost struct {
	BootID     string `json:"boot_id"`
	QEMU       string `json:"qemu"`
	QEMUSize   int64  `json:"qemu_size"`
	QEMUMtime  int64  `json:"qemu_mtime"`
	Kernel     string `json:"kernel"`
	KernelSize int64  `json:"kernel_size"`
}

func currentProbeHost(qemu, kernel string) probeHost {
	h := probeHost{Kernel: kernel}
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		h.BootID = strings.TrimSpace(string(b))
	}
	if p, err := exec.LookPath(qemu); err == nil {
		h.QEMU = p
		if st, err := os.Stat(p); err == nil {
			h.QEMUSize, h.QEMUMtime = st.Size(), st.ModTime().UnixNano()
		}
	}
	if st, err := os.Stat(kernel); err == nil {
		h.KernelSize = st.Size()
	}
	return h
}

// readProbeCache returns the cached result if it was made on this boot,
// with the same QEMU and kernel.
func readProbeCache(dir string, host probeHost) (probeRecord, bool) {
	if dir == "" || host.BootID == "" {
		return probeRecord{}, false
	}
	b, err := os.ReadFile(filepath.Join(dir, probeCacheFile))
	if err != nil {
		return probeRecord{}, false
	}
	var rec probeRecord
	if json.Unmarshal(b, &rec) != nil || rec.probeHost != host || (rec.Accel != AccelKVM && rec.Accel != AccelTCG) {
		return probeRecord{}, false
	}
	return rec, true
}

func writeProbeCache(dir string, host probeHost, r probeResult) error {
	if dir == "" || host.BootID == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(probeRecord{probeHost: host, Accel: r.accel, Reason: r.reason, ProbedAt: time.Now().UTC()})
	if err != nil {
		return err
	}
	return durable.WriteFile(filepath.Join(dir, probeCacheFile), append(b, '\n'), 0o600)
}

func openKVM() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// probeKVM boots kernel+initrd with vmgate.probe=1 under KVM: the initramfs
// prints a marker and powers off. Only that marker within ProbeTimeout
// counts as success. The probe never blocks longer than ProbeTimeout plus a
// short grace, even if QEMU cannot be reaped.
func probeKVM(ctx context.Context, qemu, kernel, initrd string) probeResult {
	if err := openKVM(); err != nil {
		return probeResult{AccelTCG, "cannot open /dev/kvm: " + err.Error()}
	}
	dir, err := os.MkdirTemp("", "vmgate-kvm-probe-")
	if err != nil {
		return probeResult{AccelTCG, "probe dir: " + err.Error()}
	}
	defer os.RemoveAll(dir)
	spec := LaunchSpec{QEMU: qemu, Dir: dir, Kernel: kernel, Initrd: initrd, MemoryMiB: 256, CPUs: 1, Accel: AccelKVM, Probe: true, TSCkHz: HostTSCkHz()}
	ok, detail := runProbe(ctx, spec, ProbeTimeout)
	if !ok {
		return probeResult{AccelTCG, detail}
	}
	return probeResult{AccelKVM, detail}
}

// ProbeMarker is what the initramfs prints in probe mode.
const ProbeMarker = "vmgate-init: probe ok"

// runProbe boots spec (which must have Probe set) and reports whether the
// probe marker appeared on the console before QEMU exited, within timeout.
func runProbe(ctx context.Context, spec LaunchSpec, timeout time.Duration) (bool, string) {
	argv, err := spec.Cmdline()
	if err != nil {
		return false, err.Error()
	}
	var out bytes.Buffer
	// The probe runs in the same jail as every VM.
	// It is bounded in time, not by a cgroup: it runs once per daemon
	// before any VM and powers off at once.
	j, err := jailedCommand(argv, jailOpts{vmDir: spec.Dir, readOnly: []string{spec.Kernel, spec.Initrd}, accel: spec.Accel, memMiB: spec.MemoryMiB})
	if err != nil {
		return false, err.Error()
	}
	cmd := j.Cmd
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	if err := j.Start(nil); err != nil {
		return false, "start qemu: " + err.Error()
	}
	waitc := make(chan error, 1)
	go func() { waitc <- cmd.Wait() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case werr := <-waitc:
		console, _ := os.ReadFile(filepath.Join(spec.Dir, ConsoleLog))
		if strings.Contains(string(console), ProbeMarker) {
			return true, fmt.Sprintf("%s booted the kernel to userspace in %v", spec.Accel, time.Since(t0).Round(time.Millisecond))
		}
		return false, fmt.Sprintf("probe guest exited (%v) without reaching userspace: %s", werr, strings.TrimSpace(out.String()+" "+tail(string(console), 300)))
	case <-timer.C:
		_ = cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-waitc:
		case <-time.After(2 * time.Second): // unkillable (stuck in the kernel): do not wait
		}
		return false, fmt.Sprintf("probe guest did not reach userspace within %v", timeout)
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGKILL)
		return false, "probe cancelled: " + ctx.Err().Error()
	}
}

// ProbeBoot boots the image's kernel and initramfs in probe mode with the
// given accelerator and reports whether it reached userspace (used by tests
// and `vmgated debug` to check a kernel/initramfs pair).
func ProbeBoot(ctx context.Context, accel Accel, qemu, kernel, initrd string, timeout time.Duration) error {
	dir, err := os.MkdirTemp("", "vmgate-probe-")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer os.RemoveAll(dir)
	ok, detail := runProbe(ctx, LaunchSpec{QEMU: qemu, Dir: dir, Kernel: kernel, Initrd: initrd, MemoryMiB: 256, CPUs: 1, Accel: accel, Probe: true, TSCkHz: HostTSCkHz()}, timeout)
	if !ok {
		return errors.New("probe: " + detail)
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

var (
	tscOnce sync.Once
	tscKHz  int
)

// HostTSCkHz returns the host's TSC frequency in kHz, or 0 if unknown. The
// guest kernel gets it as tsc_early_khz: without it, boots under TCG on a
// loaded host hang after "tsc: Fast TSC calibration failed". VMGATE_TSC_KHZ
// overrides the detection.
func HostTSCkHz() int {
	tscOnce.Do(func() {
		if v, err := strconv.Atoi(os.Getenv("VMGATE_TSC_KHZ")); err == nil && v > 0 {
			tscKHz = v
			return
		}
		if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
			if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
				tscKHz = v
				return
			}
		}
		if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
			tscKHz = ParseCPUInfoKHz(string(b))
		}
	})
	return tscKHz
}

// ParseCPUInfoKHz reads the first "cpu MHz" line of /proc/cpuinfo, in kHz.
// On x86 hosts with constant_tsc this is the TSC frequency.
func ParseCPUInfoKHz(cpuinfo string) int {
	for _, line := range strings.Split(cpuinfo, "\n") {
		k, val, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || f <= 0 {
			return 0
		}
		return int(f*1000 + 0.5)
	}
	return 0
}
