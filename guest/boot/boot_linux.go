package boot

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// Paths in the initramfs, as written by package cmd/vmgated/imagebuild/initramfs.
const (
	initPath    = "/init"
	modulesDir  = "/modules"
	moduleOrder = modulesDir + "/order"
	newRoot     = "/root"
)

// Root device polling.
const (
	rootWaitTimeout  = 60 * time.Second
	rootPollInterval = 20 * time.Millisecond
	rootWaitReport   = 5 * time.Second // how often to say we are still waiting
)

// initEnv is the whole environment of the real init.
var initEnv = []string{"HOME=/", "TERM=linux"}

// system is the operating system interface boot needs. linuxSystem is the
// real one; tests substitute a recording fake.
type system interface {
	Mount(source, target, fstype string, flags uintptr, data string) error
	Unmount(target string, flags int) error
	// LoadModule loads the kernel module file at path with the given
	// parameters ("name=value name2=value2").
	LoadModule(path, params string) error
	ReadFile(path string) ([]byte, error)
	// Exists reports whether path exists (following symlinks).
	Exists(path string) bool
	IsDir(path string) bool
	RemoveAll(path string) error
	Chdir(dir string) error
	Chroot(dir string) error
	// Exec replaces the process; it returns only on failure.
	Exec(path string, argv, env []string) error
	// PowerOff syncs and stops the machine so that QEMU exits; it returns
	// only on failure.
	PowerOff() error
	Now() time.Time
	Sleep(d time.Duration)
}

// runWith boots with s, reporting on con. If boot fails it reports the error
// and stops the machine. It returns only when stopping the machine failed, or
// with a fake system.
func runWith(s system, con io.Writer) {
	err := boot(s, con)
	if err == nil {
		return // only a fake Exec or PowerOff returns success
	}
	say(con, "%v", err)
	if err := s.PowerOff(); err != nil {
		say(con, "power off: %v", err)
	}
}

// boot runs the whole boot sequence. It returns an error describing the
// failed step; on success it does not return (the final Exec or PowerOff
// replaces or stops the process) except with a fake system, where it returns
// nil.
func boot(s system, con io.Writer) error {
	say(con, "starting")
	if err := mountPseudoFS(s); err != nil {
		return err
	}
	raw, err := s.ReadFile("/proc/cmdline")
	if err != nil {
		return fmt.Errorf("read kernel command line: %w", err)
	}
	cmd := ParseCmdline(string(raw))
	loadModules(s, con, cmd)

	if cmd.Probe {
		say(con, "probe ok")
		if err := s.PowerOff(); err != nil {
			return fmt.Errorf("power off after probe: %w", err)
		}
		return nil
	}

	if err := mountRoot(s, con, cmd); err != nil {
		return err
	}
	if err := switchRoot(s, con); err != nil {
		return err
	}
	init, argv := cmd.Init, []string{cmd.Init}
	if !cmd.InitSet && s.Exists(agentproto.RootInitMarker) {
		// An imported root: the agent is its init.
		init, argv = agentproto.AgentBinaryPath, []string{agentproto.RootInitName}
	}
	say(con, "executing %s", init)
	if err := s.Exec(init, argv, initEnv); err != nil {
		return fmt.Errorf("execute %s: %w", init, err)
	}
	return nil
}

// mountPseudoFS mounts devtmpfs, proc and sysfs. A file system that is
// already mounted (EBUSY) is fine.
func mountPseudoFS(s system) error {
	const common = unix.MS_NOSUID | unix.MS_NOEXEC | unix.MS_NODEV
	mounts := []struct {
		source, target, fstype string
		flags                  uintptr
		data                   string
	}{
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=0755"},
		{"proc", "/proc", "proc", common, ""},
		{"sysfs", "/sys", "sysfs", common, ""},
	}
	for _, m := range mounts {
		err := s.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		if err != nil && !errors.Is(err, syscall.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	return nil
}

// loadModules loads the modules listed in /modules/order, in order, each with
// the parameters the command line gives it (QEMU's microvm machine without
// ACPI describes its virtio-mmio devices as virtio_mmio.device=
// parameters). Errors are reported and skipped: a missing driver shows up
// later as a missing root device, with the cause already on the console.
func loadModules(s system, con io.Writer, cmd Cmdline) {
	data, err := s.ReadFile(moduleOrder)
	if err != nil {
		say(con, "read module list: %v", err)
		return
	}
	start := s.Now()
	total, loaded, present := 0, 0, 0
	for _, name := range strings.Split(string(data), "\n") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		total++
		if strings.Contains(name, "/") || name == "." || name == ".." {
			say(con, "load module %q: invalid file name", name)
			continue
		}
		params := cmd.ModuleParams(strings.TrimSuffix(name, ".ko"))
		switch err := s.LoadModule(modulesDir+"/"+name, params); {
		case err == nil:
			loaded++
		case errors.Is(err, syscall.EEXIST):
			present++
		default:
			say(con, "load module %s: %v", name, err)
		}
	}
	say(con, "loaded %d of %d modules (%d already present) in %v", loaded, total, present, since(s, start))
}

// mountRoot waits for the root device and mounts it on /root.
func mountRoot(s system, con io.Writer, cmd Cmdline) error {
	dev := cmd.Root
	if !strings.HasPrefix(dev, "/") {
		return fmt.Errorf("root device %q: only device paths are supported", dev)
	}
	start := s.Now()
	lastReport := start
	for !s.Exists(dev) {
		now := s.Now()
		if now.Sub(start) >= rootWaitTimeout {
			return fmt.Errorf("wait for root device %s: not present after %v", dev, rootWaitTimeout)
		}
		if now.Sub(lastReport) >= rootWaitReport {
			say(con, "still waiting for root device %s (%v)", dev, since(s, start))
			lastReport = now
		}
		s.Sleep(rootPollInterval)
	}
	say(con, "root device %s present after %v", dev, since(s, start))

	var flags uintptr
	mode := "rw"
	if cmd.ReadOnly {
		flags |= unix.MS_RDONLY
		mode = "ro"
	}
	if err := s.Mount(dev, newRoot, cmd.RootFSType, flags, cmd.RootFlags); err != nil {
		return fmt.Errorf("mount root %s (%s, %s) on %s: %w", dev, cmd.RootFSType, mode, newRoot, err)
	}
	say(con, "mounted %s (%s, %s) on %s", dev, cmd.RootFSType, mode, newRoot)
	return nil
}

// switchRoot frees what it can of the initramfs, moves /dev, /proc and /sys
// into the new root where it has a directory for them, and makes /root the
// root directory and the working directory.
func switchRoot(s system, con io.Writer) error {
	// Best effort: the initramfs is never unmounted, so removing our files
	// is what gives their memory back.
	for _, p := range []string{initPath, modulesDir} {
		if err := s.RemoveAll(p); err != nil {
			say(con, "remove %s: %v", p, err)
		}
	}
	for _, m := range []string{"/dev", "/proc", "/sys"} {
		target := newRoot + m
		if s.IsDir(target) {
			err := s.Mount(m, target, "", unix.MS_MOVE, "")
			if err == nil {
				continue
			}
			say(con, "move %s to %s: %v", m, target, err)
		}
		// Unreachable after the switch anyway; detach it.
		if err := s.Unmount(m, unix.MNT_DETACH); err != nil {
			say(con, "unmount %s: %v", m, err)
		}
	}
	if err := s.Chdir(newRoot); err != nil {
		return fmt.Errorf("switch root: chdir %s: %w", newRoot, err)
	}
	if err := s.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move %s to /: %w", newRoot, err)
	}
	if err := s.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	if err := s.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: chdir /: %w", err)
	}
	return nil
}

// since returns the time elapsed since start, rounded for display.
func since(s system, start time.Time) time.Duration {
	return s.Now().Sub(start).Round(time.Millisecond)
}

// say writes one progress or error line to the console.
func say(con io.Writer, format string, args ...any) {
	fmt.Fprintf(con, "vmgate-init: "+format+"\n", args...)
}
