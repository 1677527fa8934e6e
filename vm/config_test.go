package vm

import (
	"testing"
	"time"
)

// TestOptionsDefaults: what Options leaves out is filled in one place: a
// cold boot's limit or a restore's, the default shape or a save point's
// (when no memory size is named), and what is named is kept.
func TestOptionsDefaults(t *testing.T) {
	saved := &Machine{MemoryMiB: 768, CPUs: 3}
	for _, c := range []struct {
		name         string
		opts         Options
		restore      bool
		saved        *Machine
		mem, cpus    int
		boot, netout time.Duration
	}{
		{"cold boot", Options{}, false, nil, DefaultMemoryMiB, DefaultCPUs, DefaultBootTimeout, DefaultNetworkTimeout},
		{"template clone", Options{}, true, nil, DefaultMemoryMiB, DefaultCPUs, RestoreTimeout, DefaultNetworkTimeout},
		{"save point, its shape", Options{}, true, saved, 768, 3, RestoreTimeout, DefaultNetworkTimeout},
		{"save point, a shape named", Options{MemoryMiB: 1024}, true, saved, 1024, DefaultCPUs, RestoreTimeout, DefaultNetworkTimeout},
		{"limits named", Options{BootTimeout: time.Second, NetworkTimeout: 2 * time.Second, CPUs: 2}, true, nil, DefaultMemoryMiB, 2, time.Second, 2 * time.Second},
	} {
		o := c.opts
		if c.restore {
			o.setRestoreDefaults(c.saved)
		} else {
			o.setDefaults()
		}
		if o.MemoryMiB != c.mem || o.CPUs != c.cpus || o.BootTimeout != c.boot || o.NetworkTimeout != c.netout || o.DiskMiB != DefaultDiskMiB ||
			o.QEMU == "" || o.Accel != AccelAuto || o.Log == nil {
			t.Errorf("%s: %d MiB, %d CPUs, boot %v, network %v, disk %d, runtime %+v", c.name, o.MemoryMiB, o.CPUs, o.BootTimeout, o.NetworkTimeout, o.DiskMiB, o.Runtime)
		}
	}
}
