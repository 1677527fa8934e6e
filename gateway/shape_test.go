package gateway

import (
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// TestShapeOfVerdict: a verdict's VM shape carries every limit the host
// makes VMs by (the disk's included) and is normal, so that a paused
// session's shape, saved normal, compares equal to the shape its profile
// gives now. A shape without the disk limit lost every paused session at
// its resume ("its profile's machine changed").
func TestShapeOfVerdict(t *testing.T) {
	s := &Server{}
	s.cfg.Seccomp = "required"
	for _, tc := range []struct {
		v    policy.Verdict
		want vm.Shape
	}{
		{policy.Verdict{}, vm.Shape{Image: vm.DefaultImage, MemoryMiB: vm.DefaultMemoryMiB, CPUs: vm.DefaultCPUs, DiskMiB: vm.DefaultDiskMiB, Seccomp: "required"}},
		{policy.Verdict{Image: "ml", Limits: policy.Limits{MemoryMiB: 1024, CPUs: 2, DiskMiB: 64}},
			vm.Shape{Image: "ml", MemoryMiB: 1024, CPUs: 2, DiskMiB: 64, Seccomp: "required"}},
	} {
		got := s.shape(tc.v)
		if got != tc.want {
			t.Errorf("shape(%+v) = %+v, want %+v", tc.v.Limits, got, tc.want)
		}
		ss := newSession(newSessionRecord(sessionKey{"uid:1", "s"}, policy.Identity{}, tc.v, got, time.Now()))
		if ss.Shape.Normal() != s.shape(tc.v) {
			t.Errorf("a session of %+v does not match its own profile's shape: %+v", tc.v.Limits, ss.Shape)
		}
	}
}
