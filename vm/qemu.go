package vm

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// Accel is a QEMU accelerator choice.
type Accel string

// Accelerators. AccelAuto is resolved by [ResolveAccel] to KVM or TCG before
// any command line is built.
const (
	AccelAuto Accel = "auto"
	AccelKVM  Accel = "kvm"
	AccelTCG  Accel = "tcg"
)

// ParseAccel validates an accelerator name.
func ParseAccel(s string) (Accel, error) {
	switch a := Accel(strings.ToLower(strings.TrimSpace(s))); a {
	case AccelAuto, AccelKVM, AccelTCG:
		return a, nil
	case "":
		return AccelAuto, nil
	}
	return "", fmt.Errorf("accelerator %q: want auto, kvm or tcg", s)
}

// Names of the files in a VM directory.
const (
	OverlayFile = "overlay.qcow2"
	AgentSocket = "agent.sock"
	QMPSocket   = "qmp.sock"
	ConsoleLog  = "console.log"
	QEMULog     = "qemu.log"
	PidFile     = "qemu.pid"
)

// maxSunPath is the size of sockaddr_un.sun_path including the NUL.
const maxSunPath = 108

// SandboxArg is QEMU's own seccomp sandbox, always on.
const SandboxArg = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// LaunchSpec is everything the QEMU command line depends on.
type LaunchSpec struct {
	QEMU      string // binary; default "qemu-system-x86_64"
	Dir       string // the VM's private directory (absolute)
	Kernel    string // absolute path
	Initrd    string // absolute path
	MemoryMiB int
	CPUs      int
	Accel     Accel // AccelKVM or AccelTCG, never auto
	TSCkHz    int   // host TSC frequency for tsc_early_khz; 0 leaves it out
	// TCGTBSizeMiB sizes TCG's translation buffer (-accel tcg,tb-size=);
	// 0 leaves QEMU's default. Ignored with KVM.
	TCGTBSizeMiB int
	// KernelArgs are appended to the generated kernel command line.
	KernelArgs []string
	// NoRandMaps turns the guest's address space randomisation off
	// (norandmaps; GuestASLROff says when).
	NoRandMaps bool
	// Probe boots the kernel with vmgate.probe=1 and no disk or agent: the
	// initramfs powers off as soon as it runs (accelerator probe).
	Probe bool
	// RAMPath, when set, backs guest RAM with this file
	// (memory-backend-file): shared (RAMShared, a template writing its
	// RAM to the file) or a private copy-on-write mapping (a clone).
	RAMPath   string
	RAMShared bool
	// ConsoleFD, when set, is the fd of the pipe QEMU writes the serial
	// console to (console.go); otherwise it writes ConsoleLog itself
	// (the accelerator probe).
	ConsoleFD int
	// Incoming starts QEMU waiting for a migration stream (-incoming
	// defer); the stream is given later with QMP migrate-incoming.
	Incoming bool
	// Network adds one virtio NIC whose frames go to vmgated's user-space
	// network over the Unix socket NetSocket in the VM directory (QEMU
	// connects to it; vmgated listens). Without it the VM has no NIC.
	Network bool
}

// AgentPortID is the QEMU device id of the agent's virtio-serial port.
// With an id QEMU reports the guest opening and closing the port as
// VSERPORT_CHANGE events on QMP, which is how a template build knows the
// agent has finished its last connection (see VM.save).
const AgentPortID = "agentport"

// agentChardev is the id of the agent port's chardev (its socket).
const agentChardev = "agent"

// NetSocket is the VM's network socket (vmgated listens, QEMU connects).
const NetSocket = "net.sock"

// GuestMAC is the MAC address of a VM's NIC (each VM has its own segment).
const GuestMAC = "52:54:00:12:34:56"

// validate checks what the command line is built from.
func (s LaunchSpec) validate() error {
	if s.TCGTBSizeMiB < 0 || s.TCGTBSizeMiB > 4096 {
		return fmt.Errorf("qemu cmdline: TCG translation buffer of %d MiB out of range [0, 4096]", s.TCGTBSizeMiB)
	}
	if s.Accel != AccelKVM && s.Accel != AccelTCG {
		return fmt.Errorf("qemu cmdline: accelerator must be kvm or tcg, got %q", s.Accel)
	}
	if !filepath.IsAbs(s.Dir) || !filepath.IsAbs(s.Kernel) || !filepath.IsAbs(s.Initrd) {
		return errors.New("qemu cmdline: directory, kernel and initrd must be absolute paths")
	}
	if s.MemoryMiB < 64 || s.MemoryMiB > 1<<20 {
		return fmt.Errorf("qemu cmdline: memory %d MiB out of range", s.MemoryMiB)
	}
	if s.CPUs < 1 || s.CPUs > 64 {
		return fmt.Errorf("qemu cmdline: %d CPUs out of range", s.CPUs)
	}
	if s.RAMPath != "" && !filepath.IsAbs(s.RAMPath) {
		return fmt.Errorf("qemu cmdline: RAM path %q is not absolute", s.RAMPath)
	}
	if s.Probe && (s.RAMPath != "" || s.Incoming) {
		return errors.New("qemu cmdline: a probe boot has no RAM file and no incoming state")
	}
	for _, p := range []string{s.Dir, s.Kernel, s.Initrd, s.RAMPath} {
		if strings.ContainsAny(p, ",\n") {
			return fmt.Errorf("qemu cmdline: path %q contains a comma or newline", p)
		}
	}
	if s.Probe && s.Network {
		return errors.New("qemu cmdline: a probe boot has no network")
	}
	for _, sock := range []string{AgentSocket, QMPSocket, EventsSocket, NetSocket} {
		p := filepath.Join(s.Dir, sock)
		if len(p) >= maxSunPath {
			return fmt.Errorf("qemu cmdline: socket path %s is %d bytes, the limit is %d: use a shorter state directory", p, len(p), maxSunPath-1)
		}
	}
	return nil
}

// Cmdline returns the QEMU argv for s (argv[0] is the binary). It is pure:
// no file is touched.
func (s LaunchSpec) Cmdline() ([]string, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	qemu := s.QEMU
	if qemu == "" {
		qemu = "qemu-system-x86_64"
	}
	cpu := "max"
	if s.Accel == AccelKVM {
		cpu = "host"
	}
	// reboot=t: without ACPI a triple fault is the reset that makes QEMU
	// exit under -no-reboot (panic, guest reboot, failed boot).
	kargs := []string{"console=ttyS0", "reboot=t", "panic=-1", "quiet", "loglevel=4", "tsc=reliable"}
	if s.TSCkHz > 0 {
		kargs = append(kargs, "tsc_early_khz="+strconv.Itoa(s.TSCkHz))
	}
	if s.NoRandMaps {
		kargs = append(kargs, "norandmaps")
	}
	if s.Probe {
		kargs = append(kargs, "vmgate.probe=1")
	} else {
		kargs = append(kargs, "root=/dev/vda", "rw", "rootfstype=ext4")
	}
	kargs = append(kargs, s.KernelArgs...)
	j := func(name string) string { return filepath.Join(s.Dir, name) }
	// mem-merge=off: the host's KSM never merges guest pages across VMs
	// (a side channel between guests).
	machine := "microvm,accel=" + string(s.Accel) + ",rtc=on,mem-merge=off"
	var accelArgs []string
	if s.Accel == AccelTCG && s.TCGTBSizeMiB > 0 {
		machine = "microvm,rtc=on,mem-merge=off"
		accelArgs = []string{"-accel", "tcg,tb-size=" + strconv.Itoa(s.TCGTBSizeMiB)}
	}
	if !s.Probe {
		// Guest RAM is always the memory backend "ram" (anonymous for a
		// cold boot, a file for a template or a clone), so that the RAM
		// block has one name whatever the VM's origin: a save splits
		// that block out of the VM's migration stream (saving.go).
		machine += ",memory-backend=ram"
	}
	consolePath := j(ConsoleLog)
	if s.ConsoleFD > 0 {
		consolePath = "/proc/self/fd/" + strconv.Itoa(s.ConsoleFD)
	}
	argv := []string{
		qemu,
		"-nodefaults", "-no-user-config", "-nographic",
		"-machine", machine,
		"-cpu", cpu,
		"-m", strconv.Itoa(s.MemoryMiB),
		"-smp", strconv.Itoa(s.CPUs),
		"-kernel", s.Kernel,
		"-initrd", s.Initrd,
		"-append", strings.Join(kargs, " "),
		"-no-reboot",
		// Files and sockets are named in key=value options (-chardev
		// path=), never in the legacy "file:"/"unix:" forms, whose
		// parser breaks on a '=' in the path.
		"-chardev", "file,id=console,path=" + consolePath,
		"-serial", "chardev:console",
		"-object", "rng-random,id=rng0,filename=/dev/urandom",
		"-device", "virtio-rng-device,rng=rng0",
	}
	argv = append(argv, accelArgs...)
	if !s.Probe {
		argv = append(argv,
			"-drive", "id=root,file="+j(OverlayFile)+",format=qcow2,if=none,discard=unmap",
			"-device", "virtio-blk-device,drive=root",
			"-chardev", "socket,id="+agentChardev+",path="+j(AgentSocket)+",server=on,wait=off",
			"-device", "virtio-serial-device,max_ports=2",
			"-device", "virtserialport,chardev="+agentChardev+",name=vmgate.agent,id="+AgentPortID,
			"-chardev", "socket,id=qmp,path="+j(QMPSocket)+",server=on,wait=off",
			"-mon", "chardev=qmp,mode=control",
			"-chardev", "socket,id=events,path="+j(EventsSocket)+",server=on,wait=off",
			"-mon", "chardev=events,mode=control",
		)
	}
	if s.Network {
		argv = append(argv,
			"-netdev", "stream,id=net0,server=off,addr.type=unix,addr.path="+j(NetSocket),
			"-device", "virtio-net-device,netdev=net0,mac="+GuestMAC,
		)
	}
	switch {
	case s.RAMPath != "":
		share := "off"
		if s.RAMShared {
			share = "on"
		}
		argv = append(argv, "-object", fmt.Sprintf("memory-backend-file,id=ram,size=%dM,mem-path=%s,share=%s", s.MemoryMiB, s.RAMPath, share))
	case !s.Probe:
		argv = append(argv, "-object", fmt.Sprintf("memory-backend-ram,id=ram,size=%dM", s.MemoryMiB))
	}
	if s.Incoming {
		argv = append(argv, "-incoming", "defer")
	}
	argv = append(argv, "-sandbox", SandboxArg)
	return argv, nil
}
