package gateway

import (
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"syscall"

	"github.com/vmgate/vmgate/vm"
)

// openStateDir creates the state directory if it is missing (mkdir
// fails rather than reuse what another user made in the meantime),
// resolves it (vm.ResolveDir: the daemon uses the real path from then on)
// and refuses one that another user could plant files in: the daemon
// keeps templates, overlays and sockets there that its jails open, so a
// directory that someone else owns or may write to would let them swap
// what a VM boots or where its sockets lead.
func openStateDir(dir string, log *slog.Logger) (string, error) {
	if err := os.Mkdir(dir, 0o750); err != nil && !os.IsExist(err) {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			if _, rerr := vm.ResolveDir(dir); rerr != nil {
				err = rerr // names the component in the way
			}
			return "", fmt.Errorf("state dir: %w", err)
		}
	}
	real, err := vm.ResolveDir(dir)
	if err != nil {
		return "", fmt.Errorf("state dir: %w", err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("state dir: %w", err)
	}
	problem, relaxed := stateDirProblem(fi, os.Geteuid())
	if problem != "" {
		return "", fmt.Errorf("state dir %s: %s", real, problem)
	}
	if relaxed != "" {
		log.Warn("RELAXATION: state dir "+relaxed, "dir", real)
	}
	return real, nil
}

// stateDirProblem judges a state directory for a daemon running as euid:
// a reason to refuse it, or a relaxation to log. Only its owner may write
// to it, and the owner must be the daemon's user or root; root may use a
// directory of the service user (a try-out as root on an installed
// /var/lib/vmgate), which is logged.
func stateDirProblem(fi fs.FileInfo, euid int) (problem, relaxed string) {
	if !fi.IsDir() {
		return "not a directory", ""
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "cannot tell its owner", ""
	}
	owner := int(st.Uid)
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Sprintf("mode %04o lets users other than its owner create files in it (chmod go-w)", perm), ""
	}
	switch {
	case owner == euid, owner == 0:
		return "", ""
	case euid == 0:
		return "", fmt.Sprintf("owned by uid %d, used by root", owner)
	}
	return fmt.Sprintf("owned by uid %d, not by the daemon's uid %d or root", owner, euid), ""
}
