package isolate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/reexec"
	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/isolate/seccomp"
)

// JailRole is the re-exec role of the jail's init.
const JailRole = "jail-init"

func init() { reexec.Register(JailRole, jailInit) }

// specFD is the inherited fd carrying the Spec as JSON.
const specFD = 3

// Jail is a jailed command that has not started yet.
type Jail struct {
	// Cmd is the re-exec of vmgated that builds the jail and execs the
	// program. Set Stdout, Stderr and Dir before Start; Wait on it after.
	Cmd  *exec.Cmd
	spec []byte
	w    *os.File
}

// Command returns a jail that, when started, runs spec.Argv. stdout/stderr
// of its Cmd receive the jail's own diagnostics (one line, prefixed
// "vmgate-jail:") and then the program's.
//
// files are passed to the program as fds 4, 5, … (spec.KeepFDs is set to
// them); the caller closes its copies after Start.
//
// Precondition: spec is valid (Command validates it again).
func Command(spec Spec, files ...*os.File) (*Jail, error) {
	hostUID, hostGID := os.Getuid(), os.Getgid()
	spec.KeepFDs = nil
	for i := range files {
		spec.KeepFDs = append(spec.KeepFDs, specFD+1+i)
	}
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("jail: %w", err)
	}
	cmd := exec.Command(self)
	cmd.Args = []string{"vmgate-jail"}
	cmd.Env = []string{reexec.ChildEnv + "=" + JailRole}
	cmd.ExtraFiles = append([]*os.File{r}, files...)
	flags := uintptr(syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID |
		syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS | syscall.CLONE_NEWCGROUP)
	if spec.HostNetwork {
		flags &^= syscall.CLONE_NEWNET
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 flags,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: int(spec.UID), HostID: hostUID, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: int(spec.GID), HostID: hostGID, Size: 1}},
		GidMappingsEnableSetgroups: false,
		// Only what building the jail needs survives the re-exec; the jail
		// drops these too before it runs the program.
		AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SYS_CHROOT, unix.CAP_SETPCAP},
		Pdeathsig:   syscall.SIGKILL,
		Setpgid:     true,
	}
	return &Jail{Cmd: cmd, spec: js, w: w}, nil
}

// Start starts the jail. With a non-nil group the child joins it before it
// builds anything: it blocks reading its spec, which is written only after
// the group holds it, so every page and thread QEMU ever has is charged to
// the group. On error nothing is left running.
func (j *Jail) Start(g *cgroup.Group) error {
	defer j.w.Close()
	err := j.Cmd.Start()
	j.Cmd.ExtraFiles[0].Close() // the spec pipe's read end; the caller owns the rest
	if err != nil {
		return fmt.Errorf("jail: %w", err)
	}
	fail := func(err error) error {
		_ = j.Cmd.Process.Kill()
		_ = j.Cmd.Wait()
		return fmt.Errorf("jail: %w", err)
	}
	if g != nil {
		if err := g.Add(j.Cmd.Process.Pid); err != nil {
			return fail(err)
		}
	}
	// The spec is small (well under the pipe buffer); closing the write
	// end lets the child read it to EOF.
	if _, err := j.w.Write(j.spec); err != nil {
		return fail(fmt.Errorf("send spec: %w", err))
	}
	if err := j.w.Close(); err != nil {
		return fail(fmt.Errorf("send spec: %w", err))
	}
	return nil
}

// jailInit is the child: it builds the jail and execs the program. It only
// returns on error.
func jailInit(_ []string) error {
	// Capabilities, securebits, no_new_privs and the seccomp filter belong
	// to a thread, not to the process: every step below and the final
	// execve must run on one OS thread, or the program could be exec'd
	// from a thread that still holds the set-up's capabilities (the escape
	// suite caught it: CAP_SYS_ADMIN effective in the probe). Never
	// unlocked: the thread ends in execve.
	runtime.LockOSThread()
	f := os.NewFile(specFD, "spec")
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	f.Close()
	if err != nil {
		return fmt.Errorf("read spec: %w", err)
	}
	var s Spec
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("parse spec: %w", err)
	}
	if err := s.Validate(); err != nil {
		return err
	}
	if err := closeFDs(s.KeepFDs); err != nil {
		return err
	}
	os.Clearenv()
	root, err := buildRoot(&s)
	if err != nil {
		return err
	}
	if err := enterRoot(root); err != nil {
		return err
	}
	if err := setRlimits(&s); err != nil {
		return err
	}
	if err := dropCaps(); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("pdeathsig: %w", err)
	}
	if err := loadSeccomp(&s); err != nil {
		return err
	}
	// Last call: nothing may run between the filter and the program.
	err = unix.Exec(s.Argv[0], s.Argv, append([]string{}, s.Env...))
	return fmt.Errorf("exec %s: %w", s.Argv[0], err)
}

// loadSeccomp installs the jail's filter (package isolate/seccomp) as the
// last step before exec; a build without libseccomp fails here, since the
// policy requires the filter, unless the operator turned it off.
func loadSeccomp(s *Spec) error {
	if s.Seccomp == "off" {
		fmt.Fprintln(os.Stderr, "vmgate-jail: SECCOMP WARNING: seccomp filter disabled by configuration")
		return nil
	}
	opts := seccomp.Options{Accel: s.SeccompAccel, Network: s.SeccompNetwork, Incoming: s.SeccompIncoming, Program: s.Program}
	if err := seccomp.Install(opts, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return nil
}

// closeFDs closes every fd above 2 except keep.
func closeFDs(keep []int) error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("close fds: %w", err)
	}
	var fds []int
	for _, e := range ents {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err == nil && fd > 2 && !slices.Contains(keep, fd) {
			fds = append(fds, fd)
		}
	}
	for _, fd := range fds {
		// Go's runtime keeps a few fds (epoll, pipes) it created itself;
		// marking everything close-on-exec is as good and leaves them be.
		unix.CloseOnExec(fd)
	}
	return nil
}

// rootOp is one step of assembling the jail's root: a symlink, or a bind
// of a host path that was opened (O_PATH) before anything was mounted, so
// that mounting the new root's tmpfs cannot hide or change a source.
type rootOp struct {
	dst    string // path inside the new root
	link   string // symlink target, for symlink ops
	src    *os.File
	srcDir bool
	flags  uintptr
}

// planRoot resolves everything the jail root needs from the host.
func planRoot(s *Spec) ([]rootOp, error) {
	var ops []rootOp
	for _, l := range []string{"/lib", "/lib64", "/bin", "/sbin"} {
		if t, err := os.Readlink(l); err == nil {
			ops = append(ops, rootOp{dst: l, link: t})
		}
	}
	ro := slices.Clone(s.ReadOnly)
	sort.Strings(ro)
	for _, p := range ro {
		o, err := planPath(p, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_RDONLY)
		if err != nil {
			return nil, err
		}
		ops = append(ops, o...)
	}
	for _, p := range s.ReadWrite {
		o, err := planPath(p, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
		if err != nil {
			return nil, err
		}
		ops = append(ops, o...)
	}
	for _, d := range s.Devices {
		o, err := bindOp(d, d, unix.MS_NOSUID|unix.MS_NOEXEC)
		if err != nil {
			return nil, err
		}
		ops = append(ops, o)
	}
	return ops, nil
}

// planPath binds host path p at the same path, recreating a final symlink
// chain (e.g. libfoo.so.1 -> libfoo.so.1.2.3) so the names programs use
// exist in the jail.
func planPath(p string, flags uintptr) ([]rootOp, error) {
	var ops []rootOp
	for range 16 {
		st, err := os.Lstat(p)
		if err != nil {
			return nil, fmt.Errorf("bind %s: %w", p, err)
		}
		if st.Mode()&os.ModeSymlink == 0 {
			break
		}
		t, err := os.Readlink(p)
		if err != nil {
			return nil, fmt.Errorf("bind %s: %w", p, err)
		}
		ops = append(ops, rootOp{dst: filepath.Join(realDir(p), filepath.Base(p)), link: t})
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(p), t)
		}
		p = t
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return nil, fmt.Errorf("bind %s: %w", p, err)
	}
	o, err := bindOp(real, real, flags)
	if err != nil {
		return nil, err
	}
	return append(ops, o), nil
}

func bindOp(src, dst string, flags uintptr) (rootOp, error) {
	f, err := os.OpenFile(src, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return rootOp{}, fmt.Errorf("bind %s: %w", src, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return rootOp{}, fmt.Errorf("bind %s: %w", src, err)
	}
	return rootOp{dst: dst, src: f, srcDir: st.IsDir(), flags: flags}, nil
}

// buildRoot assembles the new root on a tmpfs and returns its path.
func buildRoot(s *Spec) (string, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return "", fmt.Errorf("make mounts private: %w", err)
	}
	ops, err := planRoot(s)
	if err != nil {
		return "", err
	}
	defer func() {
		for _, o := range ops {
			if o.src != nil {
				o.src.Close()
			}
		}
	}()
	// The tmpfs goes over a directory every host has; in this private
	// mount namespace that hides nothing from anyone else, and every
	// source is already held open.
	root := "/tmp"
	if err := unix.Mount("vmgate-jail", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=16m"); err != nil {
		return "", fmt.Errorf("mount root tmpfs: %w", err)
	}
	for _, o := range ops {
		dst := filepath.Join(root, o.dst)
		if o.src == nil {
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return "", fmt.Errorf("symlink %s: %w", o.dst, err)
			}
			if _, err := os.Lstat(dst); err == nil {
				continue
			}
			if err := os.Symlink(o.link, dst); err != nil {
				return "", fmt.Errorf("symlink %s: %w", o.dst, err)
			}
			continue
		}
		if err := bindNode(o, dst); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(root+"/dev", 0o755); err != nil {
		return "", fmt.Errorf("mkdir /dev: %w", err)
	}
	if err := os.Mkdir(root+"/proc", 0o555); err != nil {
		return "", fmt.Errorf("mkdir /proc: %w", err)
	}
	// A fresh proc of the new pid namespace shows only the jail's processes.
	if err := unix.Mount("proc", root+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return "", fmt.Errorf("mount proc: %w", err)
	}
	if err := maskProc(root); err != nil {
		return "", err
	}
	// Kernel tunables and triggers stay read-only, as in container runtimes.
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs"} {
		dst := root + p
		if _, err := os.Lstat(dst); err != nil {
			continue
		}
		if err := unix.Mount(dst, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return "", fmt.Errorf("protect %s: %w", p, err)
		}
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return "", fmt.Errorf("protect %s: %w", p, err)
		}
	}
	return root, nil
}

// maskedProc are the /proc entries that container runtimes (runc) hide:
// kernel memory, keys, timers and scheduler internals, hardware. QEMU
// needs none of them.
var maskedProc = []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
	"/proc/sched_debug", "/proc/scsi", "/proc/timer_list", "/proc/timer_stats"}

// maskProc hides maskedProc in the jail's /proc: a file under the jail's
// /dev/null, a directory under an empty read-only tmpfs.
func maskProc(root string) error {
	for _, p := range maskedProc {
		dst := root + p
		fi, err := os.Lstat(dst)
		if err != nil {
			continue // not in this kernel
		}
		if fi.IsDir() {
			err = unix.Mount("tmpfs", dst, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=0,mode=0555")
		} else {
			err = unix.Mount(root+"/dev/null", dst, "", unix.MS_BIND, "")
		}
		if err != nil {
			return fmt.Errorf("mask %s: %w", p, err)
		}
	}
	return nil
}

// realDir resolves the directory part of p on the host.
func realDir(p string) string {
	d, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return filepath.Dir(p)
	}
	return d
}

// bindNode bind-mounts the op's source on dst (creating dst as a file or
// directory like the source), then remounts it with the op's flags.
func bindNode(o rootOp, dst string) error {
	if _, err := os.Lstat(dst); err != nil {
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("bind %s: %w", o.dst, err)
		}
		if o.srcDir {
			err = os.Mkdir(dst, 0o755)
		} else {
			var f *os.File
			f, err = os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
			if err == nil {
				f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("bind %s: %w", o.dst, err)
		}
	}
	src := fmt.Sprintf("/proc/self/fd/%d", o.src.Fd())
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", o.dst, err)
	}
	flags := o.flags
	if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		// Remounting with fewer flags than the source mount has (e.g. the
		// source is already noexec) fails in a user namespace: keep the
		// source's locked flags and retry.
		var sfs unix.Statfs_t
		if unix.Statfs(dst, &sfs) == nil {
			flags |= lockedFlags(sfs.Flags)
			err = unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|flags, "")
		}
		if err != nil {
			return fmt.Errorf("remount %s: %w", o.dst, err)
		}
	}
	return nil
}

// lockedFlags maps statfs flags to the mount flags a user namespace may not
// clear on a bind of that mount.
func lockedFlags(f int64) uintptr {
	var out uintptr
	for st, m := range map[int64]uintptr{
		unix.ST_RDONLY: unix.MS_RDONLY, unix.ST_NOSUID: unix.MS_NOSUID, unix.ST_NODEV: unix.MS_NODEV,
		unix.ST_NOEXEC: unix.MS_NOEXEC, unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_RELATIME: unix.MS_RELATIME,
		unix.ST_NODIRATIME: unix.MS_NODIRATIME,
	} {
		if f&st != 0 {
			out |= m
		}
	}
	return out
}

// enterRoot pivots into root, detaches the old root and makes / read-only.
func enterRoot(root string) error {
	old := filepath.Join(root, ".old")
	if err := os.Mkdir(old, 0o700); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("chdir /: %w", err)
	}
	if err := unix.Unmount("/.old", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := os.Remove("/.old"); err != nil {
		return fmt.Errorf("remove old root mount point: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("remount / read-only: %w", err)
	}
	return nil
}

func setRlimits(s *Spec) error {
	set := func(res int, v uint64, name string) error {
		if v == 0 {
			return nil
		}
		if err := unix.Setrlimit(res, &unix.Rlimit{Cur: v, Max: v}); err != nil {
			return fmt.Errorf("rlimit %s: %w", name, err)
		}
		return nil
	}
	if s.FileSize != 0 {
		// A write past the limit fails (EFBIG) instead of killing QEMU;
		// an ignored signal stays ignored across execve.
		signal.Ignore(unix.SIGXFSZ)
	}
	return errors.Join(
		set(unix.RLIMIT_AS, s.AddressSpace, "AS"),
		set(unix.RLIMIT_NOFILE, s.OpenFiles, "NOFILE"),
		set(unix.RLIMIT_NPROC, s.Processes, "NPROC"),
		set(unix.RLIMIT_FSIZE, s.FileSize, "FSIZE"),
		unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{Cur: 0, Max: 0}),
	)
}

// dropCaps empties every capability set and locks securebits so that no
// execve can bring a capability back.
func dropCaps() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient caps: %w", err)
	}
	for c := 0; c <= unix.CAP_LAST_CAP; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("drop bounding cap %d: %w", c, err)
		}
	}
	const (
		secbitNoroot             = 1 << 0
		secbitNorootLocked       = 1 << 1
		secbitNoSetuidFixup      = 1 << 2
		secbitNoSetuidFixupLock  = 1 << 3
		secbitKeepCapsLocked     = 1 << 5
		secbitNoCapAmbientRaise  = 1 << 6
		secbitNoCapAmbientRaiseL = 1 << 7
	)
	bits := secbitNoroot | secbitNorootLocked | secbitNoSetuidFixup | secbitNoSetuidFixupLock |
		secbitKeepCapsLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseL
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); err != nil {
		return fmt.Errorf("securebits: %w", err)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}
