package bench

import (
	"context"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/procmem"
	"github.com/vmgate/vmgate/vm"
)

// The host: its machine, and what its QEMU processes take in memory.

// idleMemory lets the VMs settle and reads their QEMUs' RSS and PSS.
func idleMemory(ctx context.Context, qemus []int) Memory {
	select {
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
	}
	var rss, pss float64
	for _, pid := range qemus {
		r, p := smapsRollup(pid)
		rss += r
		pss += p
	}
	n := float64(len(qemus))
	return Memory{VMs: len(qemus), RSSMiB: math.Round(rss/n*10) / 10, PSSMiB: math.Round(pss/n*10) / 10}
}

// pids are the QEMU processes of vms.
func pids(vms []*vm.VM) []int {
	out := make([]int, len(vms))
	for i, v := range vms {
		out[i] = v.Pid()
	}
	return out
}

// smapsRollup returns Rss and Pss of pid in MiB (zeros when unreadable).
func smapsRollup(pid int) (rss, pss float64) {
	rss, pss, _ = procmem.Rollup(pid)
	return rss, pss
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
				m.MemTotalMiB = kb >> 10
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	if v, err := vm.QEMUVersion("qemu-system-x86_64"); err == nil {
		m.QEMU = v
	}
	return m
}
