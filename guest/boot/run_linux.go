package boot

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Run boots the guest as described in the package documentation. It must be
// called as PID 1 and never returns: it either executes the root file
// system's init or stops the machine. Called in any other process it prints
// an error and exits with status 1 without touching the system.
func Run() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "vmgate-init: not running as PID 1, refusing to boot")
		os.Exit(1)
	}
	con := openConsole()
	runWith(linuxSystem{console: con}, con)
	// Stopping the machine failed. Exiting PID 1 makes the kernel panic,
	// which ends the boot visibly, and with panic=-1 resets the machine.
	// (Halting instead would leave QEMU running.)
	os.Exit(1)
}

// openConsole opens /dev/console for writing, falling back to the kernel log
// and then to the standard error the kernel gave us.
func openConsole() *os.File {
	for _, p := range []string{"/dev/console", "/dev/kmsg"} {
		if f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NOCTTY, 0); err == nil {
			return f
		}
	}
	return os.Stderr
}

// linuxSystem is the real system.
type linuxSystem struct {
	console *os.File
}

var _ system = linuxSystem{}

func (linuxSystem) Mount(source, target, fstype string, flags uintptr, data string) error {
	return unix.Mount(source, target, fstype, flags, data)
}

func (linuxSystem) Unmount(target string, flags int) error {
	return unix.Unmount(target, flags)
}

func (linuxSystem) LoadModule(path, params string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.FinitModule(int(f.Fd()), params, 0)
}

func (linuxSystem) ReadFile(path string) ([]byte, error) { return os.ReadFile(path) }

func (linuxSystem) Exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (linuxSystem) IsDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

func (linuxSystem) RemoveAll(path string) error { return os.RemoveAll(path) }
func (linuxSystem) Chdir(dir string) error      { return unix.Chdir(dir) }
func (linuxSystem) Chroot(dir string) error     { return unix.Chroot(dir) }

// Exec makes sure the new program starts with the console on descriptors 0,
// 1 and 2 (the kernel leaves them closed if it could not open a console) and
// executes it.
func (s linuxSystem) Exec(path string, argv, env []string) error {
	if s.console != os.Stderr {
		fd := int(s.console.Fd())
		for target := 0; target <= 2; target++ {
			if _, err := unix.FcntlInt(uintptr(target), unix.F_GETFD, 0); err != nil {
				_ = unix.Dup3(fd, target, 0)
			}
		}
	}
	return unix.Exec(path, argv, env)
}

// PowerOff powers the machine off when the kernel can (ACPI is present);
// otherwise it restarts it. Without ACPI, as on QEMU's microvm machine with
// acpi=off, a power off request only halts the CPU and QEMU keeps running,
// while a restart is a reset, which makes QEMU exit under -no-reboot.
func (linuxSystem) PowerOff() error {
	unix.Sync()
	cmd := unix.LINUX_REBOOT_CMD_RESTART
	if _, err := os.Stat("/sys/firmware/acpi"); err == nil {
		cmd = unix.LINUX_REBOOT_CMD_POWER_OFF
	}
	return unix.Reboot(cmd)
}

func (linuxSystem) Now() time.Time        { return time.Now() }
func (linuxSystem) Sleep(d time.Duration) { time.Sleep(d) }
