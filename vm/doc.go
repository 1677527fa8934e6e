// Package vm runs commands in disposable QEMU virtual machines.
//
// A daemon builds one [Host] and takes every VM from [Host.Get]: the Host
// owns the checked image, the jails' cgroup, and a template and a pool per
// VM shape (memory, CPUs, seccomp mode, NIC). [Start] boots one VM cold;
// [Template] and [Pool] are the fast path (docs/fast-path.md).
//
// Each VM gets a private 0700 directory under the state directory holding a
// qcow2 overlay on the image's read-only base, the QMP and agent Unix
// sockets, the serial console log and a pid file. The guest agent
// (package guest/agent) answers the framed agent protocol (package
// guest/agentproto) over a virtio-serial port wired to the agent
// socket; [VM.Exec] runs one command per channel on one kept connection
// (package guest/agentconn).
//
// A VM comes up as a list of named steps over one launch value
// (launch.go): a cold boot, a restore, and a clone launched ahead
// ([Launched]) whose last steps run when a request takes it. Each step's
// duration is the VM's phase of the same name. [VM.Close] kills
// QEMU and removes every file of the VM; [CleanupStale] removes what a
// crashed daemon left behind.
//
// # Save points and forks
//
// [VM.Save] stops a VM and writes a [SavePoint]: its RAM, its device
// state and its disk (the overlay, flattened onto the image's base or
// kept as a new overlay on the one it came from), with their SHA-256
// digests (which name the save point in the audit log and receipts) and
// keyed checks (which a restore verifies), and the machine it was saved
// on: image, QEMU, accelerator, shape. [Host.Resume] restores a VM from a
// save point, refusing one saved on another machine (ErrSavePointStale) or
// damaged (ErrSavePointDamaged). A session's pause is a save point in its
// directory; its next command resumes it. A fork restores several VMs from
// one save point; a running session's fork point keeps its RAM sealed in
// memory, which the copies map copy-on-write, so that a copy costs only
// the pages it changes.
//
// Threat model: the guest is hostile. Everything it sends (frames, output,
// exit records) is treated as data with bounded size, and a guest that
// breaks the protocol loses its VM, as does one that stops reading what
// the host sends; the VM never gets a host TCP port. What the guest
// writes to its console reaches the host's log only ([Error]: its
// diagnostics are apart from its message). What it writes to its disk is
// bounded twice (disk.go): its free space is cut to Options.DiskMiB before
// it runs a command, and QEMU's RLIMIT_FSIZE bounds its overlay on the
// host whatever its root does. Under TCG QEMU itself is not a security
// boundary, which is why package isolate jails the QEMU process.
package vm
