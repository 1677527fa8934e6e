package cgroup

import (
	"fmt"
	"strconv"
)

// Limits bound one jail.
type Limits struct {
	// MemoryBytes caps resident memory (and, where the kernel accounts it,
	// swap use is forbidden). 0 leaves memory unlimited.
	MemoryBytes uint64
	// Pids caps processes and threads. 0 leaves them unlimited.
	Pids uint64
	// CPUs is the CPU quota in CPUs (1.5 = one and a half cores per
	// period). 0 leaves CPU time unlimited.
	CPUs float64
}

// Write is one control-file write.
type Write struct {
	Controller string // memory, pids or cpu
	File       string // e.g. memory.max
	Value      string
	// Optional writes are skipped when the kernel lacks the file (swap
	// accounting off, for example).
	Optional bool
}

// WeightWrite returns the write that sets a group's CPU weight relative to
// its siblings: weight is on cgroup v2's scale (1 to 10000, default 100);
// v1's cpu.shares get the same proportion of their default 1024. It is
// pure.
func WeightWrite(v int, weight int) (Write, error) {
	if weight < 1 || weight > 10000 {
		return Write{}, fmt.Errorf("cgroup: CPU weight %d out of 1..10000", weight)
	}
	switch v {
	case 2:
		return Write{"cpu", "cpu.weight", strconv.Itoa(weight), false}, nil
	case 1:
		return Write{"cpu", "cpu.shares", strconv.Itoa(max(2, weight*1024/100)), false}, nil
	}
	return Write{}, fmt.Errorf("cgroup: unknown version %d", v)
}

// cpuPeriod is the CFS period both versions use (100 ms).
const cpuPeriod = 100000

// LimitWrites returns the writes that apply l on cgroup version v (1 or
// 2), in order. It is pure.
func LimitWrites(v int, l Limits) ([]Write, error) {
	if l.CPUs < 0 {
		return nil, fmt.Errorf("cgroup: negative CPU quota %v", l.CPUs)
	}
	quota := uint64(l.CPUs * cpuPeriod)
	if l.CPUs > 0 && quota < 1000 {
		return nil, fmt.Errorf("cgroup: CPU quota %v is below 1 ms per period", l.CPUs)
	}
	var w []Write
	switch v {
	case 2:
		if l.MemoryBytes > 0 {
			m := strconv.FormatUint(l.MemoryBytes, 10)
			w = append(w,
				Write{"memory", "memory.max", m, false},
				Write{"memory", "memory.swap.max", "0", true})
		}
		if l.Pids > 0 {
			w = append(w, Write{"pids", "pids.max", strconv.FormatUint(l.Pids, 10), false})
		}
		if quota > 0 {
			w = append(w, Write{"cpu", "cpu.max", fmt.Sprintf("%d %d", quota, cpuPeriod), false})
		}
	case 1:
		if l.MemoryBytes > 0 {
			m := strconv.FormatUint(l.MemoryBytes, 10)
			// memsw must stay ≥ limit_in_bytes, so it is written after.
			w = append(w,
				Write{"memory", "memory.limit_in_bytes", m, false},
				Write{"memory", "memory.memsw.limit_in_bytes", m, true})
		}
		if l.Pids > 0 {
			w = append(w, Write{"pids", "pids.max", strconv.FormatUint(l.Pids, 10), false})
		}
		if quota > 0 {
			w = append(w,
				Write{"cpu", "cpu.cfs_period_us", strconv.Itoa(cpuPeriod), false},
				Write{"cpu", "cpu.cfs_quota_us", strconv.FormatUint(quota, 10), false})
		}
	default:
		return nil, fmt.Errorf("cgroup: unknown version %d", v)
	}
	return w, nil
}
