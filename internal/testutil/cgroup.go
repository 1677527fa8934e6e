package testutil

import (
	"os"
	"strings"
)

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
