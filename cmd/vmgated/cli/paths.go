package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/vmgate/vmgate/vm"
)

// Default system paths (see docs and the systemd units).
const (
	SystemStateDir = "/var/lib/vmgate"
)

// defaultStateDir is /var/lib/vmgate for root and for the vmgate service
// user (when it can write there), otherwise a per-user directory under
// XDG_STATE_HOME or HOME. With neither it is empty, and commands that
// need one ask for --state-dir: a predictable shared path such as
// /tmp/vmgate-$USER could be made by another user first.
func defaultStateDir() string {
	return stateDirFor(os.Geteuid() == 0 || writable(SystemStateDir), os.Getenv)
}

// stateDirFor is defaultStateDir's choice, for a caller that may use the
// system directory (system) and the environment getenv.
func stateDirFor(system bool, getenv func(string) string) string {
	if v := getenv("VMGATE_STATE_DIR"); v != "" {
		return v
	}
	if system {
		return SystemStateDir
	}
	if x := getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "vmgate")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".local", "state", "vmgate")
	}
	return ""
}

// needStateDir is the error of a command run without a state directory.
func needStateDir(dir string) error {
	if dir == "" {
		return errors.New("no state directory: pass --state-dir DIR or set VMGATE_STATE_DIR (neither XDG_STATE_HOME nor HOME is set)")
	}
	return nil
}

// ensureStateDir makes sure the state directory dir exists, creating it
// (and its parents) readable by its owner only. A path it cannot use is
// explained (vm.ResolveDir): a symlink that leads nowhere, a file in the
// way.
func ensureStateDir(dir string) error {
	if err := needStateDir(dir); err != nil {
		return err
	}
	if _, err := vm.ResolveNewDir(dir, 0o700); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return nil
}

func writable(dir string) bool {
	f, err := os.CreateTemp(dir, ".probe-")
	if err != nil {
		return false
	}
	name := f.Name()
	f.Close()
	return os.Remove(name) == nil
}

// defaultImageDir is the image directory under the state directory.
func defaultImageDir(state string) string { return filepath.Join(state, "image") }

// namedImageDir is where image name lives under the state directory (as
// vm.Host finds it): the default image, or STATE/images/NAME.
func namedImageDir(state, name string) string {
	if name == "" || name == vm.DefaultImage {
		return defaultImageDir(state)
	}
	return filepath.Join(state, "images", name)
}

// resolveDirs resolves the directories of a command that runs VMs without
// the daemon (debug run, image warm, bench exec) once, before any VM
// starts, and logs them: its VMs' jails bind files at their real paths,
// so a path through a symlink would name nothing there (vm.ResolveDir).
func resolveDirs(opts *vm.Options, log *slog.Logger) error {
	given := *opts
	if err := opts.ResolveDirs(); err != nil {
		return err
	}
	log.Info("directories", "state", opts.StateDir, "templates", opts.TemplateDir, "image", opts.ImageDir)
	if abs, _ := filepath.Abs(given.StateDir); abs != opts.StateDir {
		log.Info("state directory reached through a symlink: using its target", "given", given.StateDir, "using", opts.StateDir)
	}
	if abs, _ := filepath.Abs(given.ImageDir); abs != opts.ImageDir {
		log.Info("image directory reached through a symlink: using its target", "given", given.ImageDir, "using", opts.ImageDir)
	}
	return nil
}
