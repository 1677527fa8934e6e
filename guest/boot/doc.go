// Package boot is the init program of vmgate's initramfs: the code that
// runs as /init, PID 1, when a vmgate guest kernel starts.
//
// Role: it brings the guest from the kernel to the root file system of the
// VM image and then gets out of the way. [Run] mounts /dev, /proc and /sys,
// reads the kernel command line, loads the kernel modules listed in
// /modules/order (put there by package cmd/vmgated/imagebuild/initramfs) with any
// "module.param=value" arguments the command line gives them, as modprobe
// would, waits for the root device named by the command line, mounts it,
// moves /dev, /proc and /sys into it, switches root to it and executes the
// image's init. It is linked into the static guest agent binary, whose main
// calls [Run] when it runs as PID 1.
//
// Threat model: it trusts only the kernel command line and the initramfs it
// was built with, both chosen by the host. It reads nothing from the root file
// system except the init program it finally executes, which from then on owns
// the VM. It never returns: returning from PID 1 panics the kernel, so every
// failure is reported on the console as "vmgate-init: <what failed>: <error>"
// and the VM is stopped so that QEMU exits: powered off when the kernel can
// (ACPI present), otherwise reset, which ends QEMU under -no-reboot (without
// ACPI a power off only halts the CPU and QEMU would keep running). The VMs
// are disposable, so there is no recovery shell and no retry.
//
// Progress lines prefixed "vmgate-init: " go to /dev/console so that a serial
// console log shows where a boot stopped.
//
// Kernel command line parameters used:
//
//	vmgate.probe=1  after loading the modules, print "vmgate-init: probe ok"
//	                and stop the VM at once; the host uses it to check that
//	                the accelerator can boot the kernel to user space
//	root=           root device path (default /dev/vda)
//	rootfstype=     root file system type (default ext4)
//	rootflags=      file system specific mount options
//	ro, rw          mount the root read-only or read-write (default rw; the
//	                last one given wins)
//	init=           program to execute on the root (default /sbin/init)
//	<module>.<param>=<value>
//	                passed to that module when it is loaded
//
// Arguments after "--" are ignored. The init program is executed with argv
// [init] and the environment HOME=/ TERM=linux.
package boot
