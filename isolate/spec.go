package isolate

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// Spec describes one jail. It is built by vmgated from operator
// configuration and the VM's own paths; nothing in it comes from a request.
type Spec struct {
	// Argv is the program to run and its arguments; Argv[0] must be an
	// absolute host path that is also listed in ReadOnly (or is covered by
	// a listed directory).
	Argv []string `json:"argv"`
	// ReadOnly are host files or directories bound read-only at the same
	// path inside the jail.
	ReadOnly []string `json:"read_only"`
	// ReadWrite are host directories bound read-write (noexec) at the same
	// path: the VM's own directory.
	ReadWrite []string `json:"read_write"`
	// Devices are device nodes bound into /dev (e.g. /dev/null, /dev/kvm).
	Devices []string `json:"devices"`
	// UID and GID are the ids inside the user namespace (mapped to the
	// daemon's own ids). Must not be 0.
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// AddressSpace is RLIMIT_AS in bytes (0: unlimited); OpenFiles is
	// RLIMIT_NOFILE; Processes is RLIMIT_NPROC (per real uid on the host).
	AddressSpace uint64 `json:"address_space"`
	OpenFiles    uint64 `json:"open_files"`
	Processes    uint64 `json:"processes"`
	// FileSize is RLIMIT_FSIZE in bytes (0: unlimited): the largest file
	// the process may write. SIGXFSZ is ignored, so a write past it fails
	// with EFBIG instead of killing the process.
	FileSize uint64 `json:"file_size"`
	// Seccomp selects the filter: "required" (default; fail if it cannot be
	// loaded) or "off" (logged as a relaxation).
	Seccomp string `json:"seccomp"`
	// SeccompAccel and SeccompNetwork shape the filter (see isolate/seccomp).
	SeccompAccel   string `json:"seccomp_accel"`
	SeccompNetwork bool   `json:"seccomp_network"`
	// SeccompIncoming allows what restoring from a migration stream needs.
	SeccompIncoming bool `json:"seccomp_incoming,omitempty"`
	// KeepFDs are inherited fds (≥ 4) passed through to the program.
	KeepFDs []int `json:"keep_fds,omitempty"`
	// Env is the program's environment (KEY=VALUE; default: empty).
	Env []string `json:"env,omitempty"`
	// Program selects the seccomp allowlist: "qemu" (the default) or
	// "netstack", vmgated's guest network role (isolate/seccomp).
	Program string `json:"program,omitempty"`
	// HostNetwork keeps the host's network namespace instead of an empty
	// one: only for the netstack role, which makes the guest's outbound
	// connections. A relaxation, checked against Program.
	HostNetwork bool `json:"host_network,omitempty"`
}

// Validate checks the spec before any namespace is created.
func (s *Spec) Validate() error {
	var errs []error
	if len(s.Argv) == 0 {
		errs = append(errs, errors.New("no program"))
	} else if !filepath.IsAbs(s.Argv[0]) {
		errs = append(errs, fmt.Errorf("program %q is not an absolute path", s.Argv[0]))
	}
	if s.UID == 0 || s.GID == 0 {
		errs = append(errs, errors.New("the jail must not run as uid or gid 0"))
	}
	check := func(kind string, paths []string) {
		for _, p := range paths {
			switch {
			case !filepath.IsAbs(p) || filepath.Clean(p) != p:
				errs = append(errs, fmt.Errorf("%s path %q is not clean and absolute", kind, p))
			case p == "/":
				errs = append(errs, fmt.Errorf("%s path / would expose the whole host", kind))
			case strings.HasPrefix(p, "/proc") || strings.HasPrefix(p, "/sys"):
				errs = append(errs, fmt.Errorf("%s path %q: /proc and /sys are never bound", kind, p))
			}
		}
	}
	check("read-only", s.ReadOnly)
	check("read-write", s.ReadWrite)
	check("device", s.Devices)
	for _, d := range s.Devices {
		if !strings.HasPrefix(d, "/dev/") {
			errs = append(errs, fmt.Errorf("device %q is not under /dev", d))
		}
	}
	if len(s.Argv) > 0 && !covered(s.Argv[0], s.ReadOnly) {
		errs = append(errs, fmt.Errorf("program %s is not among the read-only paths", s.Argv[0]))
	}
	switch s.Seccomp {
	case "", "required", "off":
	default:
		errs = append(errs, fmt.Errorf("seccomp %q: want required or off", s.Seccomp))
	}
	switch s.Program {
	case "", "qemu", "netstack":
	default:
		errs = append(errs, fmt.Errorf("program kind %q: want qemu or netstack", s.Program))
	}
	if s.HostNetwork && s.Program != "netstack" {
		errs = append(errs, errors.New("only the netstack keeps the host network"))
	}
	for _, kv := range s.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsRune(kv, 0) {
			errs = append(errs, fmt.Errorf("environment entry %q is not KEY=VALUE", kv))
		}
	}
	for _, fd := range s.KeepFDs {
		if fd < 4 {
			errs = append(errs, fmt.Errorf("keep fd %d: fds 0-3 are reserved", fd))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("jail spec: %w", errors.Join(errs...))
	}
	return nil
}

func covered(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}
