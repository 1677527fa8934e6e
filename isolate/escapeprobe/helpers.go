//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// uniquePrefix starts the name of everything the probe creates.
const uniquePrefix = "vmgate-escapeprobe-"

// uniqueName is the name of files the probe creates: vmgate-escapeprobe-<pid>,
// with an optional suffix.
func uniqueName(suffix string) string {
	n := uniquePrefix + strconv.Itoa(os.Getpid())
	if suffix != "" {
		n += "-" + suffix
	}
	return n
}

// errText renders err with its errno name, e.g.
// "open /etc/shadow: no such file or directory (ENOENT)".
func errText(err error) string {
	if err == nil {
		return "ok"
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			return fmt.Sprintf("%v (%s)", err, name)
		}
	}
	return err.Error()
}

// errnoOf returns the errno in err, or 0.
func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return 0
}

// isErrno reports whether err carries one of errnos.
func isErrno(err error, errnos ...syscall.Errno) bool {
	e := errnoOf(err)
	for _, want := range errnos {
		if e == want {
			return true
		}
	}
	return false
}

// blockedIf is the common verdict: blocked when err is non-nil.
func blockedIf(what string, err error) outcome {
	if err != nil {
		return outcome{blocked: true, detail: what + ": " + errText(err)}
	}
	return outcome{blocked: false, detail: what + ": succeeded"}
}

// skip is the outcome of an attempt that was not made.
func skip(why string) outcome {
	return outcome{skipped: true, detail: "skipped: " + why}
}

// capCheckProbe judges a call made in a form that can never take effect:
// EPERM (or EACCES, or ENOSYS from a filter) means the permission check
// refused it; any other error means the check passed.
func capCheckProbe(what string, err error, passedMeans string) outcome {
	switch {
	case err == nil:
		return outcome{blocked: false, detail: what + ": succeeded"}
	case isErrno(err, unix.EPERM, unix.EACCES, unix.ENOSYS):
		return outcome{blocked: true, detail: what + ": " + errText(err)}
	default:
		return outcome{blocked: false, detail: what + ": " + errText(err) + ": " + passedMeans}
	}
}

// onThrowawayThread runs fn on an OS thread of its own that exits when fn
// returns. Use it for calls that change only the calling thread
// (credentials, capabilities, iopl, setns, ptrace links): the change dies
// with the thread. The main goroutine holds the main thread (see init), so
// this goroutine's thread is never the main thread, which could not exit.
func onThrowawayThread(fn func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the runtime terminates the thread when this
		// goroutine exits while still locked.
		defer close(done)
		fn()
	}()
	<-done
}

// scratchDir makes a fresh directory vmgate-escapeprobe-<pid>-<tag> in the
// writable dir, else in the temp dir, else in the working directory, and
// returns it with a function that removes it.
func scratchDir(c *config, tag string) (string, func(), error) {
	var candidates []string
	if c.writableDir != "" {
		candidates = append(candidates, c.writableDir)
	}
	candidates = append(candidates, os.TempDir(), "/tmp", ".")
	var firstErr error
	for _, parent := range candidates {
		p := filepath.Join(parent, uniqueName(tag))
		if !filepath.IsAbs(p) {
			if abs, err := filepath.Abs(p); err == nil {
				p = abs
			}
		}
		err := os.Mkdir(p, 0o700)
		if err == nil {
			return p, func() { os.Remove(p) }, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return "", func() {}, fmt.Errorf("no scratch directory: %w", firstErr)
}

// tryCreate creates dir/vmgate-escapeprobe-<pid> exclusively, writes a byte,
// and removes it. It returns a note about the clean-up when that failed, and
// the error of the create (or write).
func tryCreate(dir string) (note string, err error) {
	p := filepath.Join(dir, uniqueName(""))
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	_, werr := f.Write([]byte("x"))
	cerr := f.Close()
	if rerr := os.Remove(p); rerr != nil {
		note = "; clean-up failed: " + errText(rerr)
	}
	if werr != nil {
		return note, werr
	}
	return note, cerr
}

// sameFile reports whether a and b name the same inode.
func sameFile(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// procStatus returns the fields of /proc/self/status.
func procStatus() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			m[k] = strings.TrimSpace(v)
		}
	}
	return m, nil
}

// capEff returns CapEff from /proc/self/status.
func capEff() (uint64, error) {
	st, err := procStatus()
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(st["CapEff"], 16, 64)
}

// childResult runs path with argv in a forked child and waits for it. It
// returns the fork/exec error, or the wait status.
func childResult(path string, argv, env []string, sys *syscall.SysProcAttr) (syscall.WaitStatus, error) {
	if sys == nil {
		sys = &syscall.SysProcAttr{}
	}
	sys.Pdeathsig = syscall.SIGKILL
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{Env: env, Sys: sys})
	if err != nil {
		return 0, err
	}
	var ws syscall.WaitStatus
	for {
		_, werr := syscall.Wait4(pid, &ws, 0, nil)
		if werr == syscall.EINTR {
			continue
		}
		return ws, werr
	}
}

// describeStatus renders a wait status.
func describeStatus(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited():
		return fmt.Sprintf("exited with status %d", ws.ExitStatus())
	case ws.Signaled():
		return fmt.Sprintf("killed by signal %v", ws.Signal())
	default:
		return fmt.Sprintf("wait status %#x", uint32(ws))
	}
}
