package vm

import (
	"fmt"

	"github.com/vmgate/vmgate/vm/image"
)

// Machine is the machine a VM saved to files ran on (a template's, a save
// point's), which a VM restored from them must run on again: the guest
// RAM and device state hold the kernel and initramfs that booted, the
// devices and CPUs QEMU emulated and the disk the guest saw. TemplateMeta
// and SavePointMeta embed it, so that its fields are theirs in their JSON
// files; diff names the first difference, for every refusal of either.
type Machine struct {
	ImageDigest  string `json:"image_digest"` // base.qcow2 sha256
	KernelDigest string `json:"kernel_digest"`
	InitrdDigest string `json:"initrd_digest"`
	MemoryMiB    int    `json:"memory_mib"`
	CPUs         int    `json:"cpus"`
	Accel        Accel  `json:"accel"`
	QEMUVersion  string `json:"qemu_version"`
	Network      bool   `json:"network"` // the VM has a NIC
}

// machineOf is the machine that VMs of opts run on with accelerator
// accel: its image's digests (from its manifest), its QEMU's version and
// its shape.
//
// Precondition: opts has its defaults (Options.setDefaults).
func machineOf(opts Options, accel Accel) (Machine, error) {
	man, err := image.ReadManifest(opts.ImageDir)
	if err != nil {
		return Machine{}, err
	}
	qv, err := QEMUVersion(opts.QEMU)
	if err != nil {
		return Machine{}, err
	}
	return Machine{
		ImageDigest: man.Artifacts[image.BaseFile].SHA256, KernelDigest: man.Artifacts[image.KernelFile].SHA256,
		InitrdDigest: man.Artifacts[image.InitrdFile].SHA256,
		MemoryMiB:    opts.MemoryMiB, CPUs: opts.CPUs, Accel: accel, QEMUVersion: qv, Network: opts.Network != nil,
	}, nil
}

// diff names the first way in which now differs from m, the machine that
// saved files were made on ("memory (MiB) was 512, is 1024"), or is ""
// when they are one machine. It is pure.
func (m Machine) diff(now Machine) string {
	for _, c := range []struct {
		what     string
		was, now any
	}{
		{"image", m.ImageDigest, now.ImageDigest},
		{"kernel", m.KernelDigest, now.KernelDigest},
		{"initramfs", m.InitrdDigest, now.InitrdDigest},
		{"QEMU", m.QEMUVersion, now.QEMUVersion},
		{"accelerator", m.Accel, now.Accel},
		{"memory (MiB)", m.MemoryMiB, now.MemoryMiB},
		{"CPUs", m.CPUs, now.CPUs},
		{"network", m.Network, now.Network},
	} {
		if d := difference(c.what, c.was, c.now); d != "" {
			return d
		}
	}
	return ""
}

// difference says how one property of a machine changed ("CPUs was 1, is
// 2", digests shortened), or is "" when it did not.
func difference(what string, was, now any) string {
	if was == now {
		return ""
	}
	return fmt.Sprintf("%s was %s, is %s", what, short(fmt.Sprint(was)), short(fmt.Sprint(now)))
}

// short shortens a digest for a message.
func short(s string) string {
	if len(s) == 64 {
		return s[:12]
	}
	return s
}
