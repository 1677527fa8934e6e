package vm

import (
	"fmt"
	"regexp"
	"strconv"
	"sync"
)

// The guests' address space randomisation (Runtime.GuestASLR).
const (
	GuestASLRAuto = "auto"
	GuestASLROn   = "on"
)

// ParseGuestASLR validates a GuestASLR setting ("" is the default, auto).
func ParseGuestASLR(s string) (string, error) {
	switch s {
	case "", GuestASLRAuto:
		return GuestASLRAuto, nil
	case GuestASLROn:
		return GuestASLROn, nil
	}
	return "", fmt.Errorf("guest ASLR %q: want auto or on", s)
}

// GuestASLROff tells whether guests run without address space
// randomisation (the kernel's norandmaps): with mode auto, under TCG with
// a QEMU before 8.0, whose x86 translations are keyed by the guest's
// virtual address (8.0 made them PC-relative). There, every process maps
// its libraries at new addresses and QEMU translates their code anew:
// each exec costs 3-4 times what it costs at a known address, and the
// translation buffer grows by ~2 MiB per exec up to its 1 GiB (measured,
// docs/benchmarks.md). A version that cannot be read keeps the
// randomisation. It is pure.
//
// What is given up: randomisation inside the guest protects the guest's
// own processes from one another's memory-corruption exploits; the
// sandbox's boundary is the VM and its jail, which it does not touch
// (docs/security.md). GuestASLROn keeps it at the cost above.
func GuestASLROff(mode string, accel Accel, qemuVersion string) bool {
	if mode == GuestASLROn || accel != AccelTCG {
		return false
	}
	major, ok := qemuMajor(qemuVersion)
	return ok && major < 8
}

var qemuVersionRE = regexp.MustCompile(`version (\d+)\.\d+`)

// qemuMajor reads the major version from `qemu --version`'s first line.
func qemuMajor(v string) (int, bool) {
	m := qemuVersionRE.FindStringSubmatch(v)
	if m == nil {
		return 0, false
	}
	n, err := strconv.Atoi(m[1])
	return n, err == nil
}

// noRandMaps tells whether VMs of o under accel run without address space
// randomisation (GuestASLROff, with o's QEMU); the first time it does, the
// relaxation is logged.
func (o Options) noRandMaps(accel Accel) bool {
	qv, err := QEMUVersion(o.QEMU)
	off := err == nil && GuestASLROff(o.GuestASLR, accel, qv)
	if off {
		aslrLogged.Do(func() {
			o.Log.Warn("RELAXATION: guests run without address space randomisation (norandmaps): under TCG this QEMU translates a process's code again at each new address, which makes every exec 3-4 times slower and grows QEMU's translation cache; the VM and its jail are the boundary; isolate.guest_aslr = \"on\" keeps it", "qemu", qv)
		})
	}
	return off
}

var aslrLogged sync.Once
