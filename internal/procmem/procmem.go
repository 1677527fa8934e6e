// Package procmem reads a process's memory as the kernel accounts it
// (/proc/PID/smaps_rollup), for the benchmarks' memory figures.
package procmem

import (
	"os"
	"strconv"
	"strings"
)

// Rollup returns the resident (Rss) and proportional (Pss, shared pages
// divided among their sharers) memory of pid in MiB; ok is false when the
// process cannot be read (gone, or another user's).
func Rollup(pid int) (rssMiB, pssMiB float64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0, 0, false
	}
	rssMiB, pssMiB = Parse(string(b))
	return rssMiB, pssMiB, true
}

// Parse reads Rss and Pss (MiB) from the text of an smaps_rollup file;
// lines it does not know are skipped.
func Parse(text string) (rssMiB, pssMiB float64) {
	for _, l := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err != nil {
			continue
		}
		switch k {
		case "Rss":
			rssMiB = kb / 1024
		case "Pss":
			pssMiB = kb / 1024
		}
	}
	return rssMiB, pssMiB
}
