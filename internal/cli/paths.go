package cli

import (
	"os"
	"path/filepath"
)

// Default system paths (see docs and the systemd units).
const (
	SystemStateDir = "/var/lib/vmgate"
)

// defaultStateDir is /var/lib/vmgate for root and for the vmgate service
// user (when it can write there), otherwise a per-user directory.
func defaultStateDir() string {
	if v := os.Getenv("VMGATE_STATE_DIR"); v != "" {
		return v
	}
	if os.Geteuid() == 0 || writable(SystemStateDir) {
		return SystemStateDir
	}
	if x := os.Getenv("XDG_STATE_HOME"); x != "" {
		return filepath.Join(x, "vmgate")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "vmgate")
	}
	return filepath.Join(os.TempDir(), "vmgate-"+os.Getenv("USER"))
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
