// Package cgrouptest gives tests a cgroup manager of their own.
package cgrouptest

import (
	"crypto/rand"
	"encoding/hex"
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/isolate/cgroup"
)

// RequiresCgroups returns a cgroup manager with a group of its own (removed
// at the end of the test), after RequiresRoot: as root a cgroup is always
// writable, so under CI its absence fails the test.
func RequiresCgroups(t testing.TB) *cgroup.Manager {
	t.Helper()
	testutil.RequiresRoot(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	m, err := cgroup.Open("vmgate-test-"+hex.EncodeToString(b), nil)
	if err != nil {
		testutil.SkipOrFail(t, "no usable cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("cgroup manager close: %v", err)
		}
	})
	return m
}
