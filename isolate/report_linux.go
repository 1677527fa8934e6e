package isolate

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Report describes the confinement of a running process, read from /proc.
type Report struct {
	PID int `json:"pid"`
	// NewNamespaces lists the namespaces (user, mnt, pid, net, ipc, uts,
	// cgroup) in which the process differs from the caller.
	NewNamespaces []string `json:"new_namespaces"`
	SharedNS      []string `json:"shared_namespaces"`
	UIDMap        string   `json:"uid_map"`
	CapEff        string   `json:"cap_eff"`
	CapPrm        string   `json:"cap_prm"`
	CapBnd        string   `json:"cap_bnd"`
	CapAmb        string   `json:"cap_amb"`
	NoNewPrivs    bool     `json:"no_new_privs"`
	SeccompMode   int      `json:"seccomp_mode"` // 0 off, 1 strict, 2 filter
	SeccompFilter int      `json:"seccomp_filters"`
	Root          string   `json:"root"` // the process's root as seen from here
	// Cgroups lists the process's cgroups other than the root one, as
	// "controllers:path" ("0::path" on v2), seen from the caller.
	Cgroups []string `json:"cgroups,omitempty"`
}

// ReadReport inspects pid.
func ReadReport(pid int) (*Report, error) {
	r := &Report{PID: pid}
	base := "/proc/" + strconv.Itoa(pid)
	for _, ns := range []string{"user", "mnt", "pid", "net", "ipc", "uts", "cgroup"} {
		theirs, err := os.Readlink(base + "/ns/" + ns)
		if err != nil {
			return nil, fmt.Errorf("jail report: %w", err)
		}
		ours, _ := os.Readlink("/proc/self/ns/" + ns)
		if theirs != ours {
			r.NewNamespaces = append(r.NewNamespaces, ns)
		} else {
			r.SharedNS = append(r.SharedNS, ns)
		}
	}
	if b, err := os.ReadFile(base + "/uid_map"); err == nil {
		r.UIDMap = strings.Join(strings.Fields(string(b)), " ")
	}
	st, err := os.ReadFile(base + "/status")
	if err != nil {
		return nil, fmt.Errorf("jail report: %w", err)
	}
	parseStatus(string(st), r)
	r.Root, _ = os.Readlink(base + "/root")
	if b, err := os.ReadFile(base + "/cgroup"); err == nil {
		r.Cgroups = parseCgroups(string(b))
	}
	return r, nil
}

// parseCgroups keeps the lines of /proc/PID/cgroup that are not "/",
// without their hierarchy ids.
func parseCgroups(s string) []string {
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && parts[2] != "/" {
			out = append(out, parts[1]+":"+parts[2])
		}
	}
	return out
}

func parseStatus(st string, r *Report) {
	for _, line := range strings.Split(st, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "CapEff":
			r.CapEff = v
		case "CapPrm":
			r.CapPrm = v
		case "CapBnd":
			r.CapBnd = v
		case "CapAmb":
			r.CapAmb = v
		case "NoNewPrivs":
			r.NoNewPrivs = v == "1"
		case "Seccomp":
			r.SeccompMode, _ = strconv.Atoi(v)
		case "Seccomp_filters":
			r.SeccompFilter, _ = strconv.Atoi(v)
		}
	}
}

// String renders the report for people.
func (r *Report) String() string {
	cg := "none"
	if len(r.Cgroups) > 0 {
		cg = strings.Join(r.Cgroups, " ")
	}
	return fmt.Sprintf("pid %d: new namespaces %v (shared %v); uid_map %q; caps eff=%s prm=%s bnd=%s amb=%s; no_new_privs=%v; seccomp mode %d with %d filters; cgroups %s",
		r.PID, r.NewNamespaces, r.SharedNS, r.UIDMap, r.CapEff, r.CapPrm, r.CapBnd, r.CapAmb, r.NoNewPrivs, r.SeccompMode, r.SeccompFilter, cg)
}
