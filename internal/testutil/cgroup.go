package testutil

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/isolate/cgroup"
)

// RequiresCgroups returns a cgroup manager with a group of its own (removed
// at the end of the test), after RequiresRoot: as root a cgroup is always
// writable, so under CI its absence fails the test.
func RequiresCgroups(t testing.TB) *cgroup.Manager {
	t.Helper()
	RequiresRoot(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	m, err := cgroup.Open("vmgate-test-"+hex.EncodeToString(b), nil)
	if err != nil {
		skipOrFail(t, "no usable cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("cgroup manager close: %v", err)
		}
	})
	return m
}

// CgroupDirsOf lists the cgroup directories, from a /proc/PID/cgroup
// text, that name VM id and still exist.
func CgroupDirsOf(procCgroup, id string) []string {
	var out []string
	for _, line := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || !strings.Contains(f[2], id) {
			continue
		}
		ctrl := strings.Split(f[1], ",")[0]
		for _, root := range []string{"/sys/fs/cgroup/" + strings.TrimPrefix(ctrl, "name="), "/sys/fs/cgroup"} {
			if _, err := os.Stat(root + f[2]); err == nil {
				out = append(out, root+f[2])
			}
		}
	}
	return out
}
