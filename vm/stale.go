package vm

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// CleanupStale removes VM directories under stateDir/vms left by a previous
// daemon that crashed, killing any QEMU still recorded there. It returns the
// number of directories removed.
func CleanupStale(stateDir string, log *slog.Logger) (int, error) {
	if log == nil {
		log = slog.Default()
	}
	vmsDir := filepath.Join(stateDir, "vms")
	ents, err := os.ReadDir(vmsDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cleanup: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range ents {
		dir := filepath.Join(vmsDir, e.Name())
		if pid := readPid(dir); pid > 0 {
			if killed, err := killLeftoverQEMU(pid, dir); err != nil {
				log.Warn("leftover qemu not killed", "pid", pid, "dir", dir, "err", err)
			} else if killed {
				log.Warn("killed leftover qemu", "pid", pid, "dir", dir)
			}
		}
		files := dirFileNames(dir)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("removed leftover VM directory", "dir", dir, "files", files)
		n++
	}
	return n, errors.Join(errs...)
}

// killLeftoverQEMU kills pid if it is still the QEMU of dir and waits
// until it has exited, so that its cgroup can be removed next. A pidfd
// pins the process: a pid recycled after the check is never signalled.
func killLeftoverQEMU(pid int, dir string) (bool, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return false, nil
	}
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// No pidfds (a kernel before 5.3, a seccomp profile without
		// them): check, then kill by pid, without waiting.
		if !pidIsQEMUOf(pid, dir) {
			return false, nil
		}
		return true, syscall.Kill(pid, syscall.SIGKILL)
	}
	if err != nil {
		return false, fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(fd)
	if !pidIsQEMUOf(pid, dir) {
		return false, nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("kill: %w", err)
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 10_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return true, fmt.Errorf("wait for exit: %w", err)
		}
		if n == 0 {
			return true, errors.New("still running 10 s after SIGKILL")
		}
		return true, nil
	}
}

// dirFileNames lists the names in dir (the overlay, sockets and logs of a
// VM), for the log of what a cleanup removed.
func dirFileNames(dir string) []string {
	ents, _ := os.ReadDir(dir)
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func readPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, PidFile))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// pidIsQEMUOf checks that pid is still a process whose command line names
// dir, so a recycled pid is never killed.
func pidIsQEMUOf(pid int, dir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte(dir+"/"))
}
