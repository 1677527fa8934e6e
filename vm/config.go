package vm

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/vm/netstack"
)

// Runtime is how every VM of a host runs, whatever its shape: where the
// VMs' and templates' files go, which QEMU and accelerator run them, who
// starts their netstacks, where they log. A Host's VMs and templates, and
// a VM started by hand (Start), share one; the layers above embed it in
// theirs.
//
// Precondition: StateDir and TemplateDir are absolute and reach their
// directory through no symlink (ResolveDirs makes them so, where a
// program starts: gateway.New, vmgated's commands). QEMU is given paths
// under them and its jail binds each file at its real path, so a path
// through a symlink would name nothing in the jail (paths.go).
type Runtime struct {
	// StateDir is where VM directories are created (StateDir/vms/ID).
	// Required.
	StateDir string
	// TemplateDir holds VM templates (default StateDir/templates).
	TemplateDir string
	// QEMU binary; default qemu-system-x86_64 from PATH.
	QEMU string
	// Accel: auto (default), kvm or tcg.
	Accel Accel
	// TCGTBSizeMiB sizes TCG's translation buffer; 0 is QEMU's default
	// (docs/benchmarks.md has what it costs and saves).
	TCGTBSizeMiB int
	// GuestASLR is the guests' address space randomisation: GuestASLRAuto
	// (the default: off where TCG would translate each process's code
	// again, GuestASLROff) or GuestASLROn (always on).
	GuestASLR string
	// NetstackSocket, when set, is where systemd starts the guest
	// networks' netstacks (vm/netproc Config.Socket); empty: each VM's
	// netstack is jailed from here.
	NetstackSocket string
	// SecretRoots is a PEM bundle of the certificate authorities that
	// the hosts of secrets are verified against, when a netstack
	// intercepts TLS to them (vm/netproc Config.Roots); "": none, and
	// such TLS fails.
	SecretRoots string
	// Log defaults to slog.Default().
	Log *slog.Logger
}

func (r *Runtime) setDefaults() {
	if r.Accel == "" {
		r.Accel = AccelAuto
	}
	if r.GuestASLR == "" {
		r.GuestASLR = GuestASLRAuto
	}
	if r.QEMU == "" {
		r.QEMU = "qemu-system-x86_64"
	}
	if r.Log == nil {
		r.Log = slog.Default()
	}
}

// Options configure one VM (Start), or the VMs of one template
// (EnsureTemplate, LoadTemplate): the runtime, the image, the shape and
// the confinement.
type Options struct {
	Runtime
	// ImageDir holds a built image (see package image). Required;
	// absolute and through no symlink, as the Runtime's directories
	// (Options.ResolveDirs).
	ImageDir string
	// MemoryMiB defaults to DefaultMemoryMiB, CPUs to DefaultCPUs (a VM
	// restored from a save point: to its shape, when MemoryMiB is 0).
	MemoryMiB int
	CPUs      int
	// DiskMiB bounds what the guest may write to its disk (disk.go): its
	// root file system's free space once it runs, and, with a margin,
	// QEMU's overlay file (OverlayLimit). Default DefaultDiskMiB.
	DiskMiB int
	// Seccomp is the jail's filter mode: "required" (default) or "off"
	// (a logged relaxation). QEMU always runs in the jail (package isolate).
	Seccomp string
	// Cgroups, when set, puts each VM's jail in its own cgroup with
	// JailLimits; nil leaves QEMU bounded by rlimits only (the daemon logs
	// that as a relaxation).
	Cgroups *cgroup.Manager
	// Network, when set, gives the VM a NIC on its own user-space network
	// (package netstack) with this configuration; nil: no NIC at all. Its
	// policy can be replaced later (VM.Network().SetPolicy), as the host
	// does when it hands a VM out.
	Network *netstack.Config
	// BootTimeout bounds a start until the agent answers; default
	// DefaultBootTimeout for a cold boot, RestoreTimeout for a VM
	// restored from a template or a save point.
	BootTimeout time.Duration
	// NetworkTimeout bounds the wait, once the agent answers, for a VM
	// with a NIC to have a usable network (default
	// DefaultNetworkTimeout); the VM fails with ErrNetworkNotReady
	// otherwise.
	NetworkTimeout time.Duration
	// Background starts the VM at the lowest CPU weight (with cgroups),
	// so that a pool refilling itself takes only CPU time the VMs running
	// commands leave; Foreground restores the normal weight.
	Background bool
}

// Default VM shape.
const (
	DefaultMemoryMiB = 512
	DefaultCPUs      = 1
)

// DefaultBootTimeout bounds a cold boot until the agent answers.
const DefaultBootTimeout = 180 * time.Second

// RestoreTimeout bounds a restore, from QEMU's start to an agent that
// answers, unless Options.BootTimeout says otherwise. A restore takes well
// under a second to a few seconds on a loaded host; a clone that takes a
// minute is broken, and the request gets an error instead of a wait as
// long as a cold boot's.
const RestoreTimeout = time.Minute

// setDefaults fills in what o leaves out, for a cold boot (Start, a
// template's build).
func (o *Options) setDefaults() { o.defaults(nil, DefaultBootTimeout) }

// setRestoreDefaults fills in what o leaves out, for a VM restored from
// saved files (a template's clone, a save point's VM): it is bounded by
// RestoreTimeout, not a cold boot's limit, and, given the machine a save
// point was saved on, is of its shape when o names no memory size.
func (o *Options) setRestoreDefaults(saved *Machine) { o.defaults(saved, RestoreTimeout) }

// defaults is the one home of Options' defaults: the runtime's, the shape
// (saved's when o names no memory size, else the default shape), the
// disk limit and the time limits (a boot's: boot).
func (o *Options) defaults(saved *Machine, boot time.Duration) {
	o.Runtime.setDefaults()
	if saved != nil && o.MemoryMiB == 0 {
		o.MemoryMiB, o.CPUs = saved.MemoryMiB, saved.CPUs
	}
	o.MemoryMiB = cmp.Or(o.MemoryMiB, DefaultMemoryMiB)
	o.CPUs = cmp.Or(o.CPUs, DefaultCPUs)
	o.DiskMiB = cmp.Or(o.DiskMiB, DefaultDiskMiB)
	o.BootTimeout = cmp.Or(o.BootTimeout, boot)
	o.NetworkTimeout = cmp.Or(o.NetworkTimeout, DefaultNetworkTimeout)
}
