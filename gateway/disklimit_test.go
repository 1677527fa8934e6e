package gateway

import (
	"testing"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// TestDefaultDiskLimitsAgree: the disk limit a VM gets when no one names
// one (the daemon's default shape, vm.Start) is the policy's built-in
// disk_mib, so that they are one shape, one template and one pool.
func TestDefaultDiskLimitsAgree(t *testing.T) {
	if vm.DefaultDiskMiB != policy.DefaultDiskMiB {
		t.Errorf("vm.DefaultDiskMiB %d, policy.DefaultDiskMiB %d", vm.DefaultDiskMiB, policy.DefaultDiskMiB)
	}
}
