//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	rlimitNOFILE = unix.RLIMIT_NOFILE
	rlimitNPROC  = unix.RLIMIT_NPROC
	sysSetuid    = unix.SYS_SETUID
	sysSetgid    = unix.SYS_SETGID
)

func getuid() int { return unix.Getuid() }
func getgid() int { return unix.Getgid() }

func limitString(v uint64) string {
	if v == unix.RLIM_INFINITY {
		return "unlimited"
	}
	return strconv.FormatUint(v, 10)
}

// rlimitRaise tries to raise a hard limit by one; a success is undone.
func rlimitRaise(name string, resource int) attemptFunc {
	return func(*config) outcome {
		var old unix.Rlimit
		if err := unix.Getrlimit(resource, &old); err != nil {
			// Cannot read the limit (seccomp): try to lift it outright.
			inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
			serr := unix.Prlimit(0, resource, &inf, nil)
			return outcome{blocked: serr != nil, detail: "getrlimit " + name + ": " + errText(err) + "; prlimit to unlimited: " + errText(serr)}
		}
		if old.Max == unix.RLIM_INFINITY {
			return outcome{blocked: false, detail: fmt.Sprintf("%s hard limit is already unlimited", name)}
		}
		raised := unix.Rlimit{Cur: old.Max + 1, Max: old.Max + 1}
		err := unix.Prlimit(0, resource, &raised, nil)
		if err != nil {
			d := fmt.Sprintf("raise %s from %s/%s to %d: %s", name, limitString(old.Cur), limitString(old.Max), raised.Max, errText(err))
			if resource == unix.RLIMIT_NOFILE {
				if b, rerr := os.ReadFile("/proc/sys/fs/nr_open"); rerr == nil {
					if nr, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); perr == nil && old.Max >= nr {
						d += fmt.Sprintf(" (the hard limit already equals fs.nr_open %d, so even CAP_SYS_RESOURCE would fail)", nr)
					}
				}
			}
			return outcome{blocked: true, detail: d}
		}
		rerr := unix.Prlimit(0, resource, &old, nil)
		return outcome{blocked: false, detail: fmt.Sprintf("raised %s hard limit from %s to %d; restored: %s", name, limitString(old.Max), raised.Max, errText(rerr))}
	}
}

// setID calls setuid(0) or setgid(0) as a raw system call on a throw-away
// thread: the kernel changes only that thread's credentials, and the thread
// exits afterwards.
func setID(name string, sysno uintptr, current func() int) attemptFunc {
	return func(*config) outcome {
		if current() == 0 {
			eff, err := capEff()
			switch {
			case err != nil:
				return outcome{blocked: false, detail: fmt.Sprintf("already %s 0 and CapEff unreadable: %s", strings.TrimPrefix(name, "set"), errText(err))}
			case eff == 0:
				return outcome{blocked: true, detail: fmt.Sprintf("contained: already %s 0 in our user namespace, with CapEff 0", strings.TrimPrefix(name, "set"))}
			default:
				return outcome{blocked: false, detail: fmt.Sprintf("already %s 0 with CapEff %#x", strings.TrimPrefix(name, "set"), eff)}
			}
		}
		var errno syscall.Errno
		onThrowawayThread(func() {
			_, _, errno = unix.RawSyscall(sysno, 0, 0, 0)
		})
		if errno != 0 {
			return outcome{blocked: true, detail: name + "(0): " + errText(errno)}
		}
		return outcome{blocked: false, detail: name + "(0): succeeded on a throw-away thread (which then exited)"}
	}
}

// lastCap returns the highest capability number the kernel knows.
func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 && n < 64 {
			return n
		}
	}
	return 40
}

// capsetRegain tries to make every capability effective and permitted, and
// failing that, to make the permitted set effective. Capabilities are per
// thread, so both run on a throw-away thread.
func capsetRegain(*config) outcome {
	last := lastCap()
	var before [2]unix.CapUserData
	var allErr, prmErr, getErr error
	onThrowawayThread(func() {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if getErr = unix.Capget(&hdr, &data[0]); getErr != nil {
			return
		}
		before = data
		all := data
		for i := range all {
			var mask uint32
			for bit := 0; bit < 32; bit++ {
				if i*32+bit <= last {
					mask |= 1 << bit
				}
			}
			all[i].Effective = mask
			all[i].Permitted = mask
		}
		if allErr = unix.Capset(&hdr, &all[0]); allErr == nil {
			return
		}
		prm := data
		for i := range prm {
			prm[i].Effective = prm[i].Permitted
		}
		prmErr = unix.Capset(&hdr, &prm[0])
	})
	if getErr != nil {
		// Cannot read the sets (seccomp): try to set them all outright.
		var setErr error
		onThrowawayThread(func() {
			hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
			all := [2]unix.CapUserData{{Effective: ^uint32(0), Permitted: ^uint32(0)}, {Effective: ^uint32(0), Permitted: ^uint32(0)}}
			setErr = unix.Capset(&hdr, &all[0])
		})
		return outcome{blocked: setErr != nil, detail: "capget: " + errText(getErr) + "; capset all: " + errText(setErr)}
	}
	permitted := uint64(before[1].Permitted)<<32 | uint64(before[0].Permitted)
	d := fmt.Sprintf("capset all %d capabilities on a throw-away thread: %s", last+1, errText(allErr))
	if allErr == nil {
		return outcome{blocked: false, detail: d}
	}
	d += fmt.Sprintf("; capset effective = permitted (%#x): %s", permitted, errText(prmErr))
	return outcome{blocked: prmErr != nil || permitted == 0, detail: d}
}

func capEffZero(*config) outcome {
	st, err := procStatus()
	if err != nil {
		return outcome{blocked: false, detail: "read /proc/self/status: " + errText(err)}
	}
	zero := true
	var parts []string
	for _, k := range []string{"CapEff", "CapPrm", "CapAmb"} {
		v, err := strconv.ParseUint(st[k], 16, 64)
		if err != nil {
			return outcome{blocked: false, detail: fmt.Sprintf("parse %s %q: %v", k, st[k], err)}
		}
		if v != 0 {
			zero = false
		}
		parts = append(parts, fmt.Sprintf("%s %#x", k, v))
	}
	parts = append(parts, "CapBnd "+st["CapBnd"])
	return outcome{blocked: zero, detail: strings.Join(parts, ", ")}
}

func noNewPrivs(*config) outcome {
	st, err := procStatus()
	if err != nil {
		return outcome{blocked: false, detail: "read /proc/self/status: " + errText(err)}
	}
	nnp := st["NoNewPrivs"]
	d := fmt.Sprintf("NoNewPrivs: %s, Seccomp: %s", nnp, st["Seccomp"])
	return outcome{blocked: nnp == "1", detail: d}
}

const (
	forkBombLimit   = 2000
	forkBombTimeout = 60 * time.Second
)

// A seccomp filter without execve still lets a process fork (QEMU must
// create threads, and clone's thread flags are not a boundary), so the
// fork bomb and the memory hog fork raw copies of the probe that never
// exec: the child runs only the raw system calls below, on the forking
// thread's stack, without entering the Go runtime.

// forkSleeper forks a child that closes wfd and blocks reading rfd until
// EOF (when every write end is closed), then exits. It returns the child's
// pid in the parent.
//
//go:nosplit
//go:norace
func forkSleeper(rfd, wfd int) (int, syscall.Errno) {
	r1, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	if r1 != 0 {
		return int(r1), 0
	}
	syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(wfd), 0, 0)
	var b [1]byte
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(rfd), uintptr(unsafe.Pointer(&b[0])), 1)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 || n == 0 {
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
		}
	}
}

// forkBomb forks up to forkBombLimit sleeping copies of the probe and
// counts them; all are killed and reaped before it returns.
func forkBomb(*config) outcome {
	r, w, err := os.Pipe()
	if err != nil {
		return outcome{blocked: false, detail: "pipe: " + errText(err) + "; nothing tried"}
	}
	deadline := time.Now().Add(forkBombTimeout)
	pids := make([]int, 0, forkBombLimit)
	var stopErr error
	timedOut := false
	for len(pids) < forkBombLimit {
		if time.Now().After(deadline) {
			timedOut = true
			break
		}
		pid, e := forkSleeper(int(r.Fd()), int(w.Fd()))
		if e != 0 {
			stopErr = e
			break
		}
		pids = append(pids, pid)
	}
	w.Close()
	r.Close()
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	var reapErrs []string
	for _, pid := range pids {
		var ws syscall.WaitStatus
		for {
			_, err := syscall.Wait4(pid, &ws, 0, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil {
				reapErrs = append(reapErrs, fmt.Sprintf("wait %d: %s", pid, errText(err)))
			}
			break
		}
	}
	n := len(pids)
	cleanup := fmt.Sprintf("all %d killed and reaped", n)
	if len(reapErrs) > 0 {
		// The jail's filter has neither kill nor wait4: the children end
		// at the pipe's EOF and their zombies go with the pid namespace.
		cleanup = fmt.Sprintf("%d of %d not reaped (first: %s); they exit at the pipe's EOF", len(reapErrs), n, reapErrs[0])
	}
	switch {
	case stopErr != nil:
		return outcome{blocked: n < forkBombLimit, detail: fmt.Sprintf("forked %d of %d sleeping processes, then: %s (a pids cgroup or RLIMIT_NPROC); %s", n, forkBombLimit, errText(stopErr), cleanup)}
	case timedOut:
		return outcome{blocked: false, detail: fmt.Sprintf("forked %d of %d sleeping processes before the probe's own %v time limit; no limit stopped them; %s", n, forkBombLimit, forkBombTimeout, cleanup)}
	default:
		return outcome{blocked: false, detail: fmt.Sprintf("forked all %d sleeping processes; no limit stopped them; %s", n, cleanup)}
	}
}

const (
	hogTotal = 4 << 30
	hogChunk = 64 << 20
)

// forkHog forks a child that maps hogTotal bytes, 64 MiB at a time, and
// fills each chunk by reading /dev/zero (fd zero) into it, which faults in
// and charges every page. It reports on the pipe (closing rfd, writing to
// wfd): '.' per chunk, then 'D' when done, 'M' if a mapping was refused,
// 'R' if reading failed. A memory cgroup kills it with SIGKILL before it is
// done. The status pipe, not wait4, tells the parent what happened: the
// jail's filter has no wait4.
//
//go:nosplit
//go:norace
func forkHog(zero, rfd, wfd int) (int, syscall.Errno) {
	r1, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	if r1 != 0 {
		return int(r1), 0
	}
	syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(rfd), 0, 0)
	msg := [4]byte{'.', 'D', 'M', 'R'}
	for done := uintptr(0); done < hogTotal; done += hogChunk {
		p, _, e := syscall.RawSyscall6(syscall.SYS_MMAP, 0, hogChunk, syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS, ^uintptr(0), 0)
		if e != 0 {
			syscall.RawSyscall(syscall.SYS_WRITE, uintptr(wfd), uintptr(unsafe.Pointer(&msg[2])), 1)
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
		}
		for off := uintptr(0); off < hogChunk; {
			n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(zero), p+off, hogChunk-off)
			if e == syscall.EINTR {
				continue
			}
			if e != 0 || n == 0 {
				syscall.RawSyscall(syscall.SYS_WRITE, uintptr(wfd), uintptr(unsafe.Pointer(&msg[3])), 1)
				syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
			}
			off += n
		}
		syscall.RawSyscall(syscall.SYS_WRITE, uintptr(wfd), uintptr(unsafe.Pointer(&msg[0])), 1)
	}
	syscall.RawSyscall(syscall.SYS_WRITE, uintptr(wfd), uintptr(unsafe.Pointer(&msg[1])), 1)
	syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
	return 0, 0
}

// memoryHog runs forkHog's child (so only the child dies) and reports what
// stopped it.
func memoryHog(*config) outcome {
	zero, err := os.Open("/dev/zero")
	if err != nil {
		return outcome{blocked: false, detail: "open /dev/zero: " + errText(err) + "; nothing tried"}
	}
	defer zero.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return outcome{blocked: false, detail: "pipe: " + errText(err) + "; nothing tried"}
	}
	defer r.Close()
	pid, e := forkHog(int(zero.Fd()), int(r.Fd()), int(w.Fd()))
	w.Close()
	if e != 0 {
		return outcome{blocked: false, detail: "could not fork the hog child: " + errText(e) + "; nothing tried"}
	}
	status, err := io.ReadAll(r) // EOF when the child is gone
	// Reap where the filter allows it (outside a jail); inside, the
	// zombie goes with the jail's pid namespace.
	var ws syscall.WaitStatus
	how := ""
	if _, werr := syscall.Wait4(pid, &ws, 0, nil); werr == nil {
		how = "; " + describeStatus(ws)
	}
	chunks := strings.Count(string(status), ".")
	touched := fmt.Sprintf("%d MiB touched", chunks*hogChunk>>20)
	switch {
	case err != nil:
		return outcome{blocked: false, detail: "read the hog's status: " + errText(err)}
	case strings.HasSuffix(string(status), "D"):
		return outcome{blocked: false, detail: "the child touched 4 GiB: no memory limit stopped it" + how}
	case strings.HasSuffix(string(status), "M"):
		return outcome{blocked: true, detail: "a mapping was refused (RLIMIT_AS) after " + touched + how}
	case strings.HasSuffix(string(status), "R"):
		return outcome{blocked: false, detail: "reading /dev/zero failed after " + touched + "; the test is inconclusive" + how}
	}
	return outcome{blocked: true, detail: "the child died after " + touched + " of 4096, before finishing (the memory cgroup's OOM kill)" + how}
}

func mmap1TiB(*config) outcome {
	var as unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_AS, &as)
	limit := fmt.Sprintf("RLIMIT_AS %s/%s", limitString(as.Cur), limitString(as.Max))
	const size = 1 << 40
	// The pages are never touched, so even a success commits no memory.
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("mmap 1 TiB: %s (%s)", errText(err), limit)}
	}
	merr := unix.Munmap(b)
	return outcome{blocked: false, detail: fmt.Sprintf("mmap 1 TiB MAP_NORESERVE: succeeded, untouched, unmapped: %s (%s)", errText(merr), limit)}
}

func ioUringSetup(*config) outcome {
	var params [120]byte // struct io_uring_params, all zero
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
	if errno != 0 {
		return outcome{blocked: true, detail: "io_uring_setup(1): " + errText(errno)}
	}
	unix.Close(int(fd))
	return outcome{blocked: false, detail: "io_uring_setup(1): succeeded (closed)"}
}

// bpfInsns is "r0 = 0; exit": the smallest valid socket filter. An empty
// program would fail with EINVAL/E2BIG whatever the privilege, proving
// nothing. Package-level so the address handed to the kernel is stable.
var (
	bpfInsns   = [16]byte{0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0}
	bpfLicense = [4]byte{'G', 'P', 'L', 0}
)

// bpfProgLoadAttr is the BPF_PROG_LOAD part of union bpf_attr.
type bpfProgLoadAttr struct {
	progType    uint32
	insnCnt     uint32
	insns       uint64
	license     uint64
	logLevel    uint32
	logSize     uint32
	logBuf      uint64
	kernVersion uint32
	progFlags   uint32
}

func bpfProgLoad(*config) outcome {
	const bpfProgLoadCmd = 5 // BPF_PROG_LOAD
	attr := bpfProgLoadAttr{
		progType: unix.BPF_PROG_TYPE_SOCKET_FILTER,
		insnCnt:  2,
		insns:    uint64(uintptr(unsafe.Pointer(&bpfInsns[0]))),
		license:  uint64(uintptr(unsafe.Pointer(&bpfLicense[0]))),
	}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, bpfProgLoadCmd, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	if errno != 0 {
		return outcome{blocked: true, detail: "bpf(BPF_PROG_LOAD, socket filter): " + errText(errno)}
	}
	unix.Close(int(fd))
	return outcome{blocked: false, detail: "bpf(BPF_PROG_LOAD, socket filter): succeeded (closed)"}
}

func addKey(*config) outcome {
	desc := uniqueName("")
	id, err := unix.AddKey("user", desc, []byte("x"), unix.KEY_SPEC_PROCESS_KEYRING)
	if err != nil {
		return outcome{blocked: true, detail: "add_key(user, " + desc + ", process keyring): " + errText(err)}
	}
	_, ierr := unix.KeyctlInt(unix.KEYCTL_INVALIDATE, id, 0, 0, 0)
	return outcome{blocked: false, detail: fmt.Sprintf("add_key(user, %s, process keyring): succeeded (key %d; invalidated: %s)", desc, id, errText(ierr))}
}

func userfaultfd(*config) outcome {
	const uffdUserModeOnly = 1
	var parts []string
	for _, f := range []struct {
		flags uintptr
		name  string
	}{
		{unix.O_CLOEXEC | unix.O_NONBLOCK, "userfaultfd(O_CLOEXEC|O_NONBLOCK)"},
		{unix.O_CLOEXEC | unix.O_NONBLOCK | uffdUserModeOnly, "userfaultfd(...|UFFD_USER_MODE_ONLY)"},
	} {
		fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, f.flags, 0, 0)
		if errno != 0 {
			parts = append(parts, f.name+": "+errText(errno))
			continue
		}
		unix.Close(int(fd))
		parts = append(parts, f.name+": succeeded (closed)")
		return outcome{blocked: false, detail: strings.Join(parts, "; ")}
	}
	return outcome{blocked: true, detail: strings.Join(parts, "; ")}
}

func perfEventOpen(*config) outcome {
	attr := unix.PerfEventAttr{
		Type:   unix.PERF_TYPE_SOFTWARE,
		Config: unix.PERF_COUNT_SW_TASK_CLOCK,
		Bits:   unix.PerfBitDisabled | unix.PerfBitExcludeKernel | unix.PerfBitExcludeHv,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return outcome{blocked: true, detail: "perf_event_open(task clock, self, user only): " + errText(err)}
	}
	unix.Close(fd)
	return outcome{blocked: false, detail: "perf_event_open(task clock, self, user only): succeeded (closed)"}
}

func initModule(*config) outcome {
	err := unix.InitModule(make([]byte, 64), "")
	return capCheckProbe("init_module(64 zero bytes)", err, "the CAP_SYS_MODULE check passed (the image itself is garbage)")
}

func finitModule(*config) outcome {
	err := unix.FinitModule(-1, "", 0)
	return capCheckProbe("finit_module(-1)", err, "the CAP_SYS_MODULE check passed (the fd itself is bad)")
}

func rebootProbe(*config) outcome {
	// The kernel checks CAP_SYS_BOOT before the magic numbers, so a wrong
	// magic tells EPERM (no capability) from EINVAL (capability held)
	// without ever acting. The command is not a real one either.
	const badMagic, badCmd = 0, 0x6d676174
	_, _, errno := unix.Syscall6(unix.SYS_REBOOT, badMagic, badMagic, badCmd, 0, 0, 0)
	var err error
	if errno != 0 {
		err = errno
	} else {
		err = errors.New("reboot with a wrong magic number returned success")
	}
	return capCheckProbe("reboot(wrong magic)", err, "CAP_SYS_BOOT is held")
}

func ioplProbe(*config) outcome {
	var err error
	onThrowawayThread(func() { err = iopl(3) })
	if err != nil {
		return outcome{blocked: true, detail: "iopl(3): " + errText(err)}
	}
	return outcome{blocked: false, detail: "iopl(3): succeeded on a throw-away thread (reset to 0, and the thread exited)"}
}

func sethostnameSame(c *config) outcome {
	var uts unix.Utsname
	var name string
	if err := unix.Uname(&uts); err == nil {
		name = unix.ByteSliceToString(uts.Nodename[:])
	} else if b, rerr := os.ReadFile("/proc/sys/kernel/hostname"); rerr == nil {
		name = strings.TrimSpace(string(b))
	} else {
		return outcome{blocked: false, detail: "uname: " + errText(err) + "; hostname unreadable: " + errText(rerr) + "; nothing tried"}
	}
	// Setting the current name again changes nothing even if allowed.
	if err := unix.Sethostname([]byte(name)); err != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("sethostname(%q, the current name): %s", name, errText(err))}
	}
	d := fmt.Sprintf("sethostname(%q, the current name): succeeded", name)
	if c.hostPID == 0 {
		return outcome{blocked: false, detail: d + "; no --host-pid given, so containment in a UTS namespace cannot be shown"}
	}
	ours, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		return outcome{blocked: false, detail: d + "; readlink /proc/self/ns/uts: " + errText(err)}
	}
	hostLink := fmt.Sprintf("/proc/%d/ns/uts", c.hostPID)
	host, err := os.Readlink(hostLink)
	if err != nil {
		return outcome{blocked: true, detail: d + "; contained: the host's UTS namespace is hidden (" + errText(err) + ")"}
	}
	if host != ours {
		return outcome{blocked: true, detail: fmt.Sprintf("%s; contained: our UTS namespace %s is not the host's %s", d, ours, host)}
	}
	return outcome{blocked: false, detail: fmt.Sprintf("%s in the host's own UTS namespace %s", d, host)}
}
