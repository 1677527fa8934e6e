package vm

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/vmgate/vmgate/isolate"
	"github.com/vmgate/vmgate/isolate/cgroup"
)

// QEMU's data the jail must show it: loadable modules (the TCG accelerator
// is one on Debian) and firmware (microvm's qboot).
var qemuDataDirs = []string{
	"/usr/lib/x86_64-linux-gnu/qemu", "/usr/share/qemu", "/usr/share/seabios", "/usr/share/qboot",
}

// Jail ids inside the user namespace (mapped to the daemon's own ids).
const (
	jailUID = 1000
	jailGID = 1000
)

var (
	libsMu    sync.Mutex
	libsCache = map[string][]string{}
)

// sharedLibs lists the shared libraries (and the dynamic loader) of the
// binary at path, from ldd, cached per binary.
func sharedLibs(path string) ([]string, error) {
	libsMu.Lock()
	defer libsMu.Unlock()
	if l, ok := libsCache[path]; ok {
		return l, nil
	}
	out, err := exec.Command("ldd", path).Output()
	if err != nil {
		// ldd fails on static binaries (such as the escape probe).
		if strings.Contains(string(out), "not a dynamic executable") || isStatic(path) {
			libsCache[path] = nil
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w", path, err)
	}
	libs, err := ParseLDD(string(out))
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", path, err)
	}
	libsCache[path] = libs
	return libs, nil
}

func isStatic(path string) bool {
	f, err := elf.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false
		}
	}
	return true
}

// ParseLDD extracts absolute library paths from ldd output; a "not found"
// library is an error.
func ParseLDD(out string) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "linux-vdso") || strings.HasPrefix(line, "statically linked") {
			continue
		}
		if strings.Contains(line, "=> not found") {
			return nil, fmt.Errorf("missing library: %s", line)
		}
		var p string
		if _, rest, ok := strings.Cut(line, "=> "); ok {
			p, _, _ = strings.Cut(rest, " ")
		} else {
			p, _, _ = strings.Cut(line, " ")
		}
		if filepath.IsAbs(p) {
			libs = append(libs, p)
		}
	}
	return libs, sc.Err()
}

// JailSpec builds the jail for a QEMU command line: the binary, its
// libraries and data, the image files read-only, the VM directory
// read-write, and the devices QEMU opens.
func JailSpec(argv []string, vmDir string, readOnly []string, accel Accel, memMiB int) (isolate.Spec, error) {
	bin, err := exec.LookPath(argv[0])
	if err != nil {
		return isolate.Spec{}, fmt.Errorf("jail: qemu: %w", err)
	}
	bin, err = filepath.Abs(bin)
	if err != nil {
		return isolate.Spec{}, fmt.Errorf("jail: %w", err)
	}
	libs, err := sharedLibs(bin)
	if err != nil {
		return isolate.Spec{}, fmt.Errorf("jail: %w", err)
	}
	ro := append([]string{bin}, libs...)
	for _, d := range qemuDataDirs {
		if _, err := os.Stat(d); err == nil {
			ro = append(ro, d)
		}
	}
	ro = append(ro, readOnly...)
	devs := []string{"/dev/null", "/dev/zero", "/dev/urandom", "/dev/full"}
	if accel == AccelKVM {
		devs = append(devs, "/dev/kvm")
	}
	full := append([]string{bin}, argv[1:]...)
	return isolate.Spec{
		Argv: full, ReadOnly: dedupe(ro), ReadWrite: []string{vmDir}, Devices: devs,
		UID: jailUID, GID: jailGID,
		// Guest RAM plus TCG's translation cache and QEMU's own mappings.
		AddressSpace: uint64(memMiB)<<20 + 6<<30,
		OpenFiles:    1024,
		// Counted per user namespace (so per jail) when the daemon is not
		// root; QEMU needs a few dozen threads at most.
		Processes: jailProcesses,
		Seccomp:   "required", SeccompAccel: string(accel),
		// QEMU keeps transparent huge pages, under TCG too: it advises
		// them for its translation cache, which a restored guest fills
		// from nothing while its agent answers the first host; without
		// them each 4 KiB of new code took a page fault, ~12 ms of every
		// restore's agent step here. They cost an idle QEMU ~2-3 MiB (a
		// firmware block in a 2 MiB page, the cache's last page partly
		// used; docs/benchmarks.md, "The agent step, fixed").
	}, nil
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// JailLimits are the cgroup limits of a VM's jail: guest RAM plus what
// QEMU needs beside it (TCG's translation cache, device buffers, its own
// heap), as many tasks as RLIMIT_NPROC allows, and one CPU more than the
// guest has for QEMU's main loop and I/O threads.
func JailLimits(memMiB, cpus int) cgroup.Limits {
	return cgroup.Limits{
		MemoryBytes: uint64(memMiB)<<20 + qemuOverhead,
		Pids:        jailProcesses,
		CPUs:        float64(cpus + 1),
	}
}

// qemuOverhead is QEMU's memory beside guest RAM: TCG's translation cache
// (QEMU's default of up to 1 GiB is mapped but only touched as code is
// translated) and its own heap.
const qemuOverhead = 1 << 30

// jailProcesses bounds QEMU's threads (RLIMIT_NPROC and pids.max).
const jailProcesses = 256

// jailOpts are what a VM's jail depends on beside QEMU's argv.
type jailOpts struct {
	vmDir    string
	readOnly []string // files and directories shown read-only
	accel    Accel
	memMiB   int
	// overlay bounds the overlay file (OverlayLimit); 0 without a disk
	// (the probe).
	overlay uint64
	// ramFile: QEMU writes the guest's RAM to a file (a template build).
	ramFile  bool
	seccomp  string
	incoming bool // a restore
	network  bool
}

// FileSizeLimit is RLIMIT_FSIZE of a VM's QEMU: the largest file it
// writes is its overlay, which may grow up to overlay bytes (OverlayLimit:
// the VM's disk limit is the host's hard bound there), or a template's
// RAM file of ramFileMiB (0 for a VM whose RAM is no file of its own), so
// nothing else it writes can grow past that. Its log and a probe's
// console may take 64 MiB. It is pure.
func FileSizeLimit(ramFileMiB int, overlay uint64) uint64 {
	return max(overlay, uint64(max(ramFileMiB, 0)+64)<<20)
}

// resolverFiles are what Go's resolver reads, bound into the netstack's
// jail when they exist.
var resolverFiles = []string{"/etc/resolv.conf", "/etc/hosts"}

// NetstackSpec is the jail of a VM's netstack (package vm/netproc): this
// very binary, its libraries and the resolver's files read-only, nothing
// writable, no devices but /dev/null and /dev/urandom.
func NetstackSpec(seccompMode string) (isolate.Spec, error) {
	bin, err := os.Executable()
	if err != nil {
		return isolate.Spec{}, fmt.Errorf("netstack jail: %w", err)
	}
	if bin, err = filepath.EvalSymlinks(bin); err != nil {
		return isolate.Spec{}, fmt.Errorf("netstack jail: %w", err)
	}
	libs, err := sharedLibs(bin)
	if err != nil {
		return isolate.Spec{}, fmt.Errorf("netstack jail: %w", err)
	}
	ro := append([]string{bin}, libs...)
	for _, f := range resolverFiles {
		if _, err := os.Stat(f); err == nil {
			ro = append(ro, f)
		}
	}
	return isolate.Spec{
		Argv: []string{bin}, ReadOnly: dedupe(ro), Devices: []string{"/dev/null", "/dev/urandom"},
		UID: jailUID, GID: jailGID,
		// The Go heap of one VM's network: at most 32 connections by
		// default, their buffers and gVisor's.
		AddressSpace: 4 << 30,
		OpenFiles:    1024,
		Processes:    jailProcesses,
		FileSize:     1, // it writes no files
		Seccomp:      seccompMode,
	}, nil
}

// jailedCommand returns the jail that runs argv.
func jailedCommand(argv []string, o jailOpts, files ...*os.File) (*isolate.Jail, error) {
	spec, err := o.spec(argv)
	if err != nil {
		return nil, err
	}
	return isolate.Command(spec, files...)
}

// spec is the jail of argv.
func (o jailOpts) spec(argv []string) (isolate.Spec, error) {
	spec, err := JailSpec(argv, o.vmDir, o.readOnly, o.accel, o.memMiB)
	if err != nil {
		return isolate.Spec{}, err
	}
	ram := 0
	if o.ramFile {
		ram = o.memMiB
	}
	spec.FileSize = FileSizeLimit(ram, o.overlay)
	if o.seccomp != "" {
		spec.Seccomp = o.seccomp
	}
	spec.SeccompIncoming, spec.SeccompNetwork = o.incoming, o.network
	return spec, nil
}
