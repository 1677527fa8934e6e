package cgroup

import (
	"bufio"
	"fmt"
	"path"
	"strings"
)

// Controllers are the ones a jail is limited with.
var Controllers = []string{"memory", "pids", "cpu"}

// Layout is where this process's cgroups are on the host.
type Layout struct {
	// V2Dir is the process's cgroup directory on the unified hierarchy,
	// or "" when no cgroup2 file system is mounted.
	V2Dir string
	// V1Dirs maps each mounted v1 controller of Controllers to the
	// process's cgroup directory in that controller's hierarchy.
	V1Dirs map[string]string
}

type mount struct {
	root, point, fstype string
	superOpts           []string
}

// Detect computes the Layout from the text of /proc/self/cgroup and
// /proc/self/mountinfo. It is pure.
func Detect(procCgroup, mountinfo string) (Layout, error) {
	paths := map[string]string{} // controller ("" for v2) -> cgroup path
	sc := bufio.NewScanner(strings.NewReader(procCgroup))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || !strings.HasPrefix(parts[2], "/") {
			return Layout{}, fmt.Errorf("cgroup: malformed /proc/self/cgroup line %q", line)
		}
		if parts[0] == "0" && parts[1] == "" {
			paths[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			paths[c] = parts[2]
		}
	}
	mounts, err := parseMountinfo(mountinfo)
	if err != nil {
		return Layout{}, err
	}
	l := Layout{V1Dirs: map[string]string{}}
	for _, m := range mounts {
		switch m.fstype {
		case "cgroup2":
			if p, ok := paths[""]; ok && l.V2Dir == "" {
				if d, ok := under(m, p); ok {
					l.V2Dir = d
				}
			}
		case "cgroup":
			for _, c := range Controllers {
				p, ok := paths[c]
				if !ok || l.V1Dirs[c] != "" || !contains(m.superOpts, c) {
					continue
				}
				if d, ok := under(m, p); ok {
					l.V1Dirs[c] = d
				}
			}
		}
	}
	return l, sc.Err()
}

// under maps cgroup path p to a directory below mount m, when m shows it.
func under(m mount, p string) (string, bool) {
	if m.root == "/" {
		return path.Join(m.point, p), true
	}
	if p == m.root || strings.HasPrefix(p, m.root+"/") {
		return path.Join(m.point, strings.TrimPrefix(p, m.root)), true
	}
	return "", false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// parseMountinfo reads the fields Detect needs (see proc(5)).
func parseMountinfo(s string) ([]mount, error) {
	var out []mount
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		g := strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			return nil, fmt.Errorf("cgroup: malformed mountinfo line %q", line)
		}
		out = append(out, mount{root: unescape(f[3]), point: unescape(f[4]), fstype: g[0], superOpts: strings.Split(g[2], ",")})
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for space, etc.).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) && isOctal(s[i+1:i+4]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return true
}
