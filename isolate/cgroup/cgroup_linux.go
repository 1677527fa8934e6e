package cgroup

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Manager owns this daemon's group of VM cgroups.
type Manager struct {
	version int
	// base maps controller ("" on v2) to the daemon's group directory.
	base        map[string]string
	controllers []string // usable controllers, sorted
	enable      string   // v2: the subtree_control line of the base
	log         *slog.Logger
}

// vmPrefix names per-VM groups inside the daemon's group.
const vmPrefix = "vm-"

// GroupName derives the daemon's group name from its state directory, so
// that daemons with different state never share (or clean up) groups.
func GroupName(stateDir string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return "vmgate-" + hex.EncodeToString(sum[:6])
}

// Open finds a cgroup this process may use, creates the daemon's group
// (named name) in it and removes empty per-VM groups a previous run left.
// The error says why no cgroup can be used; callers decide whether that is
// fatal.
func Open(name string, log *slog.Logger) (*Manager, error) {
	if log == nil {
		log = slog.Default()
	}
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroup: bad group name %q", name)
	}
	pc, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	l, err := Detect(string(pc), string(mi))
	if err != nil {
		return nil, err
	}
	m := &Manager{log: log, base: map[string]string{}}
	var why []error
	if l.V2Dir != "" {
		err := m.openV2(l.V2Dir, name)
		if err == nil {
			return m, nil
		}
		why = append(why, err)
	}
	if len(l.V1Dirs) > 0 {
		err := m.openV1(l.V1Dirs, name)
		if err == nil {
			return m, nil
		}
		why = append(why, err)
	}
	if len(why) == 0 {
		return nil, errors.New("cgroup: no cgroup file system is mounted")
	}
	return nil, errors.Join(why...)
}

func (m *Manager) openV2(own, name string) error {
	b, err := os.ReadFile(filepath.Join(own, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	have := strings.Fields(string(b))
	var use []string
	for _, c := range Controllers {
		if slices.Contains(have, c) {
			use = append(use, c)
		}
	}
	if len(use) == 0 {
		return fmt.Errorf("cgroup v2: %s offers none of %v (controllers: %q; on a hybrid host they are bound to v1)", own, Controllers, strings.TrimSpace(string(b)))
	}
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control"} {
		if err := unix.Access(filepath.Join(own, f), unix.W_OK); err != nil {
			return fmt.Errorf("cgroup v2: %s is not writable by uid %d (not delegated: under systemd set Delegate=yes): %w", filepath.Join(own, f), os.Getuid(), err)
		}
	}
	enable := "+" + strings.Join(use, " +")
	// A cgroup with processes cannot enable controllers for its children
	// (except the root): move this daemon into a leaf first.
	if err := writeFile(filepath.Join(own, "cgroup.subtree_control"), enable); errors.Is(err, unix.EBUSY) {
		leaf := filepath.Join(own, "daemon")
		if err := mkdir(leaf); err != nil {
			return fmt.Errorf("cgroup v2: %w", err)
		}
		if err := moveAll(own, leaf); err != nil {
			return fmt.Errorf("cgroup v2: move the daemon into %s: %w", leaf, err)
		}
		if err := writeFile(filepath.Join(own, "cgroup.subtree_control"), enable); err != nil {
			return fmt.Errorf("cgroup v2: enable %v in %s: %w", use, own, err)
		}
	} else if err != nil {
		return fmt.Errorf("cgroup v2: enable %v in %s: %w", use, own, err)
	}
	base := filepath.Join(own, name)
	if err := mkdir(base); err != nil {
		return fmt.Errorf("cgroup v2: %w", err)
	}
	if err := writeFile(filepath.Join(base, "cgroup.subtree_control"), enable); err != nil {
		return fmt.Errorf("cgroup v2: enable %v in %s: %w", use, base, err)
	}
	m.version, m.base[""], m.controllers, m.enable = 2, base, use, enable
	m.removeStale()
	return nil
}

func (m *Manager) openV1(dirs map[string]string, name string) error {
	var why []string
	for _, c := range Controllers {
		own, ok := dirs[c]
		if !ok {
			why = append(why, c+": not mounted")
			continue
		}
		if err := unix.Access(own, unix.W_OK); err != nil {
			why = append(why, fmt.Sprintf("%s: %s not writable by uid %d", c, own, os.Getuid()))
			continue
		}
		base := filepath.Join(own, name)
		if err := mkdir(base); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", c, err))
			continue
		}
		m.base[c] = base
		m.controllers = append(m.controllers, c)
	}
	if len(m.controllers) == 0 {
		return fmt.Errorf("cgroup v1: no usable controller (%s)", strings.Join(why, "; "))
	}
	m.version = 1
	if len(why) > 0 {
		m.log.Warn("RELAXATION: cgroup v1: some jail limits cannot be applied", "missing", strings.Join(why, "; "))
	}
	m.removeStale()
	return nil
}

// removeStale removes empty per-VM groups a previous run left behind.
func (m *Manager) removeStale() {
	for _, base := range m.base {
		ents, _ := os.ReadDir(base)
		for _, e := range ents {
			if e.IsDir() && strings.HasPrefix(e.Name(), vmPrefix) {
				dir := filepath.Join(base, e.Name())
				if err := rmdirRetry(dir, 0); err != nil {
					m.log.Warn("cgroup: leftover VM group not removed", "dir", dir, "err", err)
					continue
				}
				m.log.Info("cgroup: removed leftover VM group", "dir", dir)
			}
		}
	}
}

// Version is 1 or 2.
func (m *Manager) Version() int { return m.version }

// Controllers are the usable ones, of Controllers.
func (m *Manager) Controllers() []string { return slices.Clone(m.controllers) }

// String describes the manager for logs.
func (m *Manager) String() string {
	var parts []string
	for _, k := range sortedKeys(m.base) {
		if k == "" {
			parts = append(parts, m.base[k])
		} else {
			parts = append(parts, k+"="+m.base[k])
		}
	}
	return fmt.Sprintf("cgroup v%d %v at %s", m.version, m.controllers, strings.Join(parts, " "))
}

// Close removes the daemon's group; VM groups must have been removed.
func (m *Manager) Close() error {
	var errs []error
	m.removeStale()
	for _, b := range m.base {
		if err := rmdirRetry(b, time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Group is one VM's cgroup (one directory per hierarchy on v1).
type Group struct {
	version int
	dirs    map[string]string
	limits  Limits
}

// New creates the group for VM id with limits. Controllers the manager
// lacks are skipped (Open logged that).
func (m *Manager) New(id string, l Limits) (*Group, error) {
	if id == "" || strings.ContainsAny(id, "/\x00.") {
		return nil, fmt.Errorf("cgroup: bad VM id %q", id)
	}
	writes, err := LimitWrites(m.version, l)
	if err != nil {
		return nil, err
	}
	g := &Group{version: m.version, dirs: map[string]string{}, limits: l}
	for k, b := range m.base {
		d := filepath.Join(b, vmPrefix+id)
		err := os.Mkdir(d, 0o755)
		if errors.Is(err, os.ErrNotExist) {
			// The daemon's group was removed from outside (an operator,
			// a cleanup tool): make it again rather than fail every
			// later VM.
			if err = m.recreate(k, b); err == nil {
				err = os.Mkdir(d, 0o755)
			}
		}
		if err != nil {
			g.Remove()
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		g.dirs[k] = d
	}
	for _, w := range writes {
		dir, ok := g.dirs[w.Controller]
		if m.version == 2 {
			dir, ok = g.dirs[""], slices.Contains(m.controllers, w.Controller)
		}
		if !ok {
			continue
		}
		err := writeFile(filepath.Join(dir, w.File), w.Value)
		if err != nil && !(w.Optional && errors.Is(err, os.ErrNotExist)) {
			g.Remove()
			return nil, fmt.Errorf("cgroup: set %s=%s: %w", w.File, w.Value, err)
		}
	}
	return g, nil
}

// recreate makes the daemon's group base again (for controller k on v1)
// after it was removed from outside, with its controllers enabled for the
// VMs' groups on v2.
func (m *Manager) recreate(k, base string) error {
	if err := mkdir(base); err != nil {
		return fmt.Errorf("recreate %s: %w", base, err)
	}
	if m.version == 2 {
		if err := writeFile(filepath.Join(base, "cgroup.subtree_control"), m.enable); err != nil {
			return fmt.Errorf("recreate %s: enable %s: %w", base, m.enable, err)
		}
	}
	m.log.Warn("cgroup: the daemon's group was removed from outside; recreated it", "dir", base, "controller", k)
	return nil
}

// SetCPUWeight sets the group's CPU weight (see WeightWrite); without the
// cpu controller it does nothing.
func (g *Group) SetCPUWeight(weight int) error {
	w, err := WeightWrite(g.version, weight)
	if err != nil {
		return err
	}
	dir, ok := g.dirs[w.Controller]
	if g.version == 2 {
		dir, ok = g.dirs[""], true
	}
	if !ok {
		return nil
	}
	if err := writeFile(filepath.Join(dir, w.File), w.Value); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup: set %s=%s: %w", w.File, w.Value, err)
	}
	return nil
}

// Add moves process pid (and its threads) into the group.
func (g *Group) Add(pid int) error {
	for _, k := range sortedKeys(g.dirs) {
		if err := writeFile(filepath.Join(g.dirs[k], "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("cgroup: add pid %d to %s: %w", pid, g.dirs[k], err)
		}
	}
	return nil
}

// Dirs returns the group's directories, sorted.
func (g *Group) Dirs() []string {
	var out []string
	for _, k := range sortedKeys(g.dirs) {
		out = append(out, g.dirs[k])
	}
	return out
}

// Limits are the limits the group was created with.
func (g *Group) Limits() Limits { return g.limits }

// Remove kills what is left in the group and removes it. It waits up to
// five seconds for the kernel to let go of exited processes.
func (g *Group) Remove() error {
	var errs []error
	for _, k := range sortedKeys(g.dirs) {
		d := g.dirs[k]
		killAll(d)
		if err := rmdirRetry(d, 5*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Stat reads a few usage figures (for reports): peak or current memory and
// the number of pids, keyed by file name; missing files are left out.
func (g *Group) Stat() map[string]string {
	out := map[string]string{}
	for _, k := range sortedKeys(g.dirs) {
		for _, f := range []string{"memory.peak", "memory.current", "memory.max_usage_in_bytes", "memory.usage_in_bytes", "pids.current", "memory.events"} {
			if b, err := os.ReadFile(filepath.Join(g.dirs[k], f)); err == nil {
				out[f] = strings.TrimSpace(string(b))
			}
		}
	}
	return out
}

func killAll(dir string) {
	if writeFile(filepath.Join(dir, "cgroup.kill"), "1") == nil {
		return
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
	}
}

func rmdirRetry(dir string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("cgroup: remove %s: %w", dir, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// moveAll moves every process of cgroup from into cgroup to.
func moveAll(from, to string) error {
	b, err := os.ReadFile(filepath.Join(from, "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, f := range strings.Fields(string(b)) {
		if err := writeFile(filepath.Join(to, "cgroup.procs"), f); err != nil && !errors.Is(err, unix.ESRCH) {
			return err
		}
	}
	return nil
}

func mkdir(d string) error {
	if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return nil
}

// writeFile writes one value to a control file (no O_CREAT, no O_TRUNC:
// control files are not regular files).
func writeFile(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func sortedKeys(m map[string]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Delegate creates the child group name of the daemon's group and hands it
// to uid/gid the way systemd's Delegate=yes does: the directory and the
// files that move processes and enable controllers become theirs, the
// limit files stay the manager's. It returns the group's directories (one
// per hierarchy on v1) and a function that removes them.
func (m *Manager) Delegate(name string, uid, gid int) ([]string, func() error, error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || strings.HasPrefix(name, vmPrefix) || name == "." || name == ".." {
		return nil, nil, fmt.Errorf("cgroup: bad group name %q", name)
	}
	g := &Group{version: m.version, dirs: map[string]string{}}
	for k, b := range m.base {
		d := filepath.Join(b, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			g.Remove()
			return nil, nil, fmt.Errorf("cgroup: %w", err)
		}
		g.dirs[k] = d
		for _, f := range []string{"", "cgroup.procs", "cgroup.threads", "cgroup.subtree_control", "tasks"} {
			if err := os.Chown(filepath.Join(d, f), uid, gid); err != nil && !errors.Is(err, os.ErrNotExist) {
				g.Remove()
				return nil, nil, fmt.Errorf("cgroup: delegate %s: %w", d, err)
			}
		}
	}
	remove := func() error {
		// The delegatee's own groups go first (children before parents).
		for _, d := range g.dirs {
			removeTree(d)
		}
		return g.Remove()
	}
	return g.Dirs(), remove, nil
}

// removeTree removes the groups below dir, deepest first.
func removeTree(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			sub := filepath.Join(dir, e.Name())
			removeTree(sub)
			killAll(sub)
			_ = rmdirRetry(sub, 5*time.Second)
		}
	}
}

// OpenMode opens the manager as the operator's mode asks: "required"
// returns Open's error; "auto" logs it as a relaxation and returns nil;
// "off" logs the relaxation and opens nothing. A nil manager means rlimits
// only.
func OpenMode(mode, name string, log *slog.Logger) (*Manager, error) {
	if log == nil {
		log = slog.Default()
	}
	switch mode {
	case "off":
		log.Warn("RELAXATION: jail cgroups are off by configuration (isolate.cgroups = \"off\"): QEMU's memory, tasks and CPU are bounded by rlimits only")
		return nil, nil
	case "auto", "required", "":
	default:
		return nil, fmt.Errorf("cgroups %q: want auto, required or off", mode)
	}
	m, err := Open(name, log)
	switch {
	case err == nil:
		log.Info("jail cgroups", "where", m.String())
		return m, nil
	case mode == "required":
		return nil, fmt.Errorf("isolate.cgroups = \"required\" but no cgroup can be used: %w", err)
	}
	log.Warn("RELAXATION: no cgroup for the jails (run vmgated under systemd with Delegate=yes, or set isolate.cgroups = \"required\" to refuse to start): QEMU's memory, tasks and CPU are bounded by rlimits only", "reason", err)
	return nil, nil
}
