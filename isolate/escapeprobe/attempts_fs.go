//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// readFirst opens path and reads up to n bytes; the bytes are discarded.
func readFirst(path string, n int) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	got, err := io.ReadFull(f, make([]byte, n))
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		err = nil
	}
	if err != nil {
		return got, fmt.Errorf("read %s: %w", path, err)
	}
	return got, nil
}

func readFileAttempt(path string) outcome {
	n, err := readFirst(path, 64)
	if err != nil {
		return outcome{blocked: true, detail: errText(err)}
	}
	return outcome{blocked: false, detail: fmt.Sprintf("read %d bytes of %s", n, path)}
}

func readEtcShadow(*config) outcome { return readFileAttempt("/etc/shadow") }
func readEtcPasswd(*config) outcome { return readFileAttempt("/etc/passwd") }

func readHostFiles(c *config) outcome {
	if len(c.hostFiles) == 0 {
		return skip("no --host-file given")
	}
	var parts []string
	blocked := true
	for _, p := range c.hostFiles {
		n, err := readFirst(p, 64)
		if err != nil {
			parts = append(parts, errText(err))
			continue
		}
		blocked = false
		parts = append(parts, fmt.Sprintf("READ %d bytes of %s", n, p))
	}
	return outcome{blocked: blocked, detail: strings.Join(parts, "; ")}
}

func listDir(path string) outcome {
	ents, err := os.ReadDir(path)
	if err != nil {
		return outcome{blocked: true, detail: errText(err)}
	}
	return outcome{blocked: false, detail: fmt.Sprintf("listed %s: %d entries", path, len(ents))}
}

func listHostDir(c *config) outcome {
	if c.hostDir == "" {
		return skip("no --host-dir given")
	}
	return listDir(c.hostDir)
}

func writeInto(dir string) outcome {
	note, err := tryCreate(dir)
	if err != nil {
		return outcome{blocked: true, detail: errText(err) + note}
	}
	return outcome{blocked: false, detail: fmt.Sprintf("created and removed %s in %s%s", uniqueName(""), dir, note)}
}

func writeHostDir(c *config) outcome {
	if c.hostDir == "" {
		return skip("no --host-dir given")
	}
	return writeInto(c.hostDir)
}

func statOtherVMDir(c *config) outcome {
	if c.otherVMDir == "" {
		return skip("no --other-vm-dir given")
	}
	_, err := os.Stat(c.otherVMDir)
	return blockedIf("stat "+c.otherVMDir, err)
}

func listOtherVMDir(c *config) outcome {
	if c.otherVMDir == "" {
		return skip("no --other-vm-dir given")
	}
	ents, err := os.ReadDir(c.otherVMDir)
	if err != nil {
		return outcome{blocked: true, detail: errText(err)}
	}
	detail := fmt.Sprintf("listed %s: %d entries", c.otherVMDir, len(ents))
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		p := filepath.Join(c.otherVMDir, e.Name())
		n, err := readFirst(p, 64)
		if err != nil {
			detail += "; " + errText(err)
		} else {
			detail += fmt.Sprintf("; READ %d bytes of %s", n, p)
		}
		break
	}
	return outcome{blocked: false, detail: detail}
}

func writeOtherVMDir(c *config) outcome {
	if c.otherVMDir == "" {
		return skip("no --other-vm-dir given")
	}
	return writeInto(c.otherVMDir)
}

// writeSystemDir tries to create a file in dir; a success counts as
// contained only when dir is the VM's own writable directory.
func writeSystemDir(dir string) attemptFunc {
	return func(c *config) outcome {
		o := writeInto(dir)
		if !o.blocked && sameFile(dir, c.writableDir) {
			o.blocked = true
			o.detail += fmt.Sprintf("; contained: %s is the --writable-dir %s", dir, c.writableDir)
		}
		return o
	}
}

func writeOwnVMDir(c *config) outcome {
	if c.writableDir == "" {
		return skip("no --writable-dir given")
	}
	return writeInto(c.writableDir)
}

func readDevUrandom(*config) outcome {
	n, err := readFirst("/dev/urandom", 16)
	if err == nil && n != 16 {
		err = fmt.Errorf("read /dev/urandom: short read of %d bytes", n)
	}
	if err != nil {
		return outcome{blocked: true, detail: errText(err)}
	}
	return outcome{blocked: false, detail: "read 16 bytes of /dev/urandom"}
}

// openRO opens path read-only without reading and closes it.
func openRO(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	return unix.Close(fd)
}

func openDev(path string) attemptFunc {
	return func(*config) outcome {
		return openROAttempt(path)
	}
}

func openDevKVM(c *config) outcome {
	if !c.noKVM {
		return skip("--no-kvm not given: KVM may legitimately be in use")
	}
	return openROAttempt("/dev/kvm")
}

func openROAttempt(path string) outcome {
	if err := openRO(path); err != nil {
		return outcome{blocked: true, detail: errText(err)}
	}
	return outcome{blocked: false, detail: "opened " + path + " read-only (closed unread)"}
}

// openForWrite opens path for writing and closes it without writing.
func openForWrite(path string) attemptFunc {
	return func(*config) outcome {
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if err != nil {
			return outcome{blocked: true, detail: "open " + path + " for writing: " + errText(err)}
		}
		unix.Close(fd)
		return outcome{blocked: false, detail: "opened " + path + " for writing (closed without writing)"}
	}
}

func writeSysKernel(c *config) outcome {
	candidates := []string{
		"/sys/kernel/mm/transparent_hugepage/enabled",
		"/sys/kernel/uevent_helper",
		"/sys/kernel/profiling",
		"/sys/kernel/rcu_expedited",
	}
	var missing []string
	for _, p := range candidates {
		if _, err := os.Lstat(p); err != nil {
			missing = append(missing, errText(err))
			continue
		}
		return openForWrite(p)(c)
	}
	return outcome{blocked: true, detail: "no /sys/kernel file visible: " + strings.Join(missing, "; ")}
}

func readProcKcore(*config) outcome {
	n, err := readFirst("/proc/kcore", 64)
	if err != nil {
		return outcome{blocked: true, detail: errText(err)}
	}
	return outcome{blocked: false, detail: fmt.Sprintf("read %d bytes of /proc/kcore", n)}
}

func mknodCharDevice(c *config) outcome {
	dir := c.writableDir
	if dir == "" {
		dir = os.TempDir()
	}
	p := filepath.Join(dir, uniqueName("chr"))
	if err := unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("mknod %s c 1 3: %s", p, errText(err))}
	}
	defer os.Remove(p)
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return outcome{blocked: true, detail: fmt.Sprintf("mknod %s c 1 3 succeeded, but open: %s", p, errText(err))}
	}
	unix.Close(fd)
	return outcome{blocked: false, detail: fmt.Sprintf("mknod %s c 1 3 and open succeeded (removed)", p)}
}

func openByHandleAt(*config) outcome {
	mfd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return outcome{blocked: true, detail: "open /: " + errText(err)}
	}
	defer unix.Close(mfd)
	h, _, herr := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
	how := "a handle of / from name_to_handle_at"
	if herr != nil {
		// The file system cannot make handles; a made-up one still meets
		// the permission check first.
		h = unix.NewFileHandle(1, make([]byte, 8))
		how = "a made-up handle (name_to_handle_at: " + errText(herr) + ")"
	}
	fd, err := unix.OpenByHandleAt(mfd, h, unix.O_RDONLY|unix.O_CLOEXEC)
	if err == nil {
		unix.Close(fd)
		return outcome{blocked: false, detail: "open_by_handle_at with " + how + ": succeeded"}
	}
	return capCheckProbe("open_by_handle_at with "+how, err, "the CAP_DAC_READ_SEARCH check passed")
}
