//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

func mountTmpfs(c *config) outcome {
	dir, cleanup, err := scratchDir(c, "mnt")
	if err != nil {
		return skip(errText(err))
	}
	defer cleanup()
	err = unix.Mount("vmgate-escapeprobe", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=16k,mode=0700")
	if err != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("mount tmpfs on %s: %s", dir, errText(err))}
	}
	uerr := unix.Unmount(dir, 0)
	if uerr != nil {
		uerr = unix.Unmount(dir, unix.MNT_DETACH)
	}
	return outcome{blocked: false, detail: fmt.Sprintf("mount tmpfs on %s: succeeded; unmount: %s", dir, errText(uerr))}
}

func umountRoot(*config) outcome {
	// MNT_EXPIRE on the root is always refused with EINVAL, after the
	// permission check, so this can never unmount or remount anything.
	err := unix.Unmount("/", unix.MNT_EXPIRE)
	return capCheckProbe(`umount2("/", MNT_EXPIRE)`, err, "the mount permission check passed (EINVAL is the refusal of MNT_EXPIRE on the root)")
}

func pivotRoot(c *config) outcome {
	dir, cleanup, err := scratchDir(c, "pivot")
	if err != nil {
		return skip(errText(err))
	}
	defer cleanup()
	// A fresh directory is not a mount point, so pivot_root refuses it with
	// EINVAL after the permission check (EPERM).
	err = unix.PivotRoot(dir, dir)
	return capCheckProbe(fmt.Sprintf("pivot_root(%s, %s) on a non-mount-point", dir, dir), err, "the mount permission check passed")
}

// cloneProbe clones a child with flags; the child then execs a path that
// does not exist, so nothing runs in the new namespace. ENOENT from the
// exec means the clone succeeded.
func cloneProbe(flags uintptr, flagName string) outcome {
	missing := "/" + uniqueName("nonexistent")
	ws, err := childResult(missing, []string{missing}, []string{}, &syscall.SysProcAttr{Cloneflags: flags})
	switch {
	case err == nil:
		return outcome{blocked: false, detail: fmt.Sprintf("clone(%s) succeeded; the child %s", flagName, describeStatus(ws))}
	case errors.Is(err, syscall.ENOENT):
		return outcome{blocked: false, detail: fmt.Sprintf("clone(%s) succeeded (the child's exec of a missing path then failed as planned)", flagName)}
	default:
		return outcome{blocked: true, detail: fmt.Sprintf("clone(%s): %s", flagName, errText(err))}
	}
}

func unshareUser(*config) outcome { return cloneProbe(unix.CLONE_NEWUSER, "CLONE_NEWUSER") }
func unshareMount(*config) outcome {
	return cloneProbe(unix.CLONE_NEWNS, "CLONE_NEWNS")
}

func setnsHostMnt(c *config) outcome {
	if c.hostPID == 0 {
		return skip("no --host-pid given")
	}
	p := fmt.Sprintf("/proc/%d/ns/mnt", c.hostPID)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return outcome{blocked: true, detail: "open " + p + ": " + errText(err)}
	}
	defer unix.Close(fd)
	// setns(CLONE_NEWNS) always fails in a multi-threaded process with
	// EINVAL once the permission check (EPERM) has passed, so this cannot
	// move the probe; a single-threaded attacker would get the same EPERM.
	var serr error
	onThrowawayThread(func() { serr = unix.Setns(fd, unix.CLONE_NEWNS) })
	if serr == nil {
		return outcome{blocked: false, detail: "open " + p + " and setns: succeeded"}
	}
	if isErrno(serr, unix.EPERM, unix.EACCES, unix.ENOSYS) {
		return outcome{blocked: true, detail: "opened " + p + ", but setns: " + errText(serr)}
	}
	return outcome{blocked: false, detail: "opened " + p + "; setns: " + errText(serr) + ": the permission check passed (a single-threaded process could enter)"}
}

func setnsHostNet(c *config) outcome {
	if c.hostPID == 0 {
		return skip("no --host-pid given")
	}
	p := fmt.Sprintf("/proc/%d/ns/net", c.hostPID)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return outcome{blocked: true, detail: "open " + p + ": " + errText(err)}
	}
	defer unix.Close(fd)
	var serr error
	onThrowawayThread(func() { serr = unix.Setns(fd, unix.CLONE_NEWNET) })
	if serr != nil {
		return outcome{blocked: true, detail: "opened " + p + ", but setns: " + errText(serr)}
	}
	return outcome{blocked: false, detail: "open " + p + " and setns on a throw-away thread: succeeded"}
}

// rootGuard saves the current root and working directory so a chroot can
// be undone: fchdir to the old root, chroot("."), fchdir to the old cwd.
type rootGuard struct{ root, cwd int }

func saveRoot() (*rootGuard, error) {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /: %w", err)
	}
	cwd, err := unix.Open(".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(root)
		return nil, fmt.Errorf("open .: %w", err)
	}
	return &rootGuard{root: root, cwd: cwd}, nil
}

// restore undoes any chroot made since saveRoot and closes the guard.
func (g *rootGuard) restore() error {
	defer unix.Close(g.root)
	defer unix.Close(g.cwd)
	if err := unix.Fchdir(g.root); err != nil {
		return fmt.Errorf("fchdir old root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot old root: %w", err)
	}
	if err := unix.Fchdir(g.cwd); err != nil {
		return fmt.Errorf("fchdir old cwd: %w", err)
	}
	return nil
}

func chrootDotDot(*config) outcome {
	g, err := saveRoot()
	if err != nil {
		return outcome{blocked: false, detail: "cannot save the root to undo a chroot, so none was tried: " + errText(err)}
	}
	if err := unix.Chroot(".."); err != nil {
		unix.Close(g.root)
		unix.Close(g.cwd)
		return outcome{blocked: true, detail: `chroot(".."): ` + errText(err)}
	}
	rerr := g.restore()
	return outcome{blocked: false, detail: `chroot(".."): succeeded; root restored: ` + errText(rerr)}
}

func chrootEscape(c *config) outcome {
	dir, cleanup, err := scratchDir(c, "chroot")
	if err != nil {
		return skip(errText(err))
	}
	defer cleanup()
	var before unix.Stat_t
	if err := unix.Stat("/", &before); err != nil {
		return outcome{blocked: false, detail: "cannot stat / to compare roots, so no chroot was tried: " + errText(err)}
	}
	g, err := saveRoot()
	if err != nil {
		return outcome{blocked: false, detail: "cannot save the root to undo a chroot, so none was tried: " + errText(err)}
	}
	if err := unix.Chroot(dir); err != nil {
		unix.Close(g.root)
		unix.Close(g.cwd)
		return outcome{blocked: true, detail: fmt.Sprintf("chroot(%s): %s", dir, errText(err))}
	}
	// From here on the root must be restored whatever happens.
	var walkErr, shadowErr error
	var after unix.Stat_t
	func() {
		for i := 0; i < 64; i++ {
			if err := unix.Chdir(".."); err != nil {
				walkErr = err
				return
			}
		}
		if err := unix.Chroot("."); err != nil {
			walkErr = err
			return
		}
		if err := unix.Stat("/", &after); err != nil {
			walkErr = err
			return
		}
		_, shadowErr = readFirst("/etc/shadow", 64)
	}()
	rerr := g.restore()
	restored := "root restored: " + errText(rerr)
	if walkErr != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("chroot(%s) succeeded, but the '..' walk: %s; %s", dir, errText(walkErr), restored)}
	}
	where := "the original root"
	if after.Dev != before.Dev || after.Ino != before.Ino {
		where = "a DIFFERENT root than the original"
	}
	if shadowErr != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("chroot and '..' walk succeeded and ended at %s, but /etc/shadow: %s; %s", where, errText(shadowErr), restored)}
	}
	return outcome{blocked: false, detail: fmt.Sprintf("chroot and '..' walk succeeded, ended at %s, and /etc/shadow is readable; %s", where, restored)}
}

func execBinSh(*config) outcome {
	ws, err := childResult("/bin/sh", []string{"sh", "-c", "exit 0"}, []string{"PATH=/usr/bin:/bin"}, nil)
	if err != nil {
		return outcome{blocked: true, detail: "execve /bin/sh: " + errText(err)}
	}
	if ws.Signaled() {
		return outcome{blocked: true, detail: "execve /bin/sh: the child was " + describeStatus(ws)}
	}
	return outcome{blocked: false, detail: "execve /bin/sh: ran; it " + describeStatus(ws)}
}

func execSelf(*config) outcome {
	ws, err := childResult("/proc/self/exe", []string{filepath.Base(os.Args[0])}, []string{modeEnv + "=exit"}, nil)
	if err != nil {
		return outcome{blocked: true, detail: "execve /proc/self/exe: " + errText(err)}
	}
	if ws.Signaled() {
		return outcome{blocked: true, detail: "execve /proc/self/exe: the child was " + describeStatus(ws)}
	}
	return outcome{blocked: false, detail: "execve /proc/self/exe: ran; it " + describeStatus(ws)}
}
