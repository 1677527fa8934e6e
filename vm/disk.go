package vm

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// Disk limits. A guest writes to its disk, and every block it writes that
// its overlay does not hold yet grows the overlay file on the host's state
// disk: without a bound, one guest filling its image's root file system
// takes gigabytes of the host (a 4 GiB image's dd took ~3.5 GiB), and
// max_vms guests at once take that many times more. Options.DiskMiB (the
// policy's disk_mib) bounds a VM in two ways:
//
//   - In the guest, the normal case: once the agent answers, the root file
//     system's free space is cut to the limit by a reserve file
//     (ReserveFile, fallocate: the file system marks the blocks used and
//     writes only its metadata, so the overlay barely grows), and the
//     blocks ext4 keeps for root are given to everyone (tune2fs -r 0), so
//     root and the unprivileged user see the same limit. A command that
//     writes more gets ENOSPC ("No space left on device") from its own
//     kernel, and the VM runs on. A template makes the reserve before it
//     is saved, so its clones have it from their first instruction.
//   - On the host, the hard bound: QEMU runs with RLIMIT_FSIZE at
//     OverlayLimit (FileSizeLimit), so its overlay file cannot grow past
//     it whatever the guest does; SIGXFSZ is ignored in the jail, so QEMU
//     gets EFBIG and reports a write error to the guest (QEMU's default
//     werror=enospc stops the guest only on ENOSPC, which the event
//     watcher keeps for the host's own full disk, events.go).
//
// What the guest sees at the hard bound is an I/O error, not ENOSPC. A
// guest can reach it: its root by deleting the reserve file, or by
// writing blocks the overlay does not hold while freeing others
// (rewriting the image's files), since the free space counts live files
// and the overlay every block ever written; and small writes scattered
// over the disk cost the overlay more than they take from the free space
// (it allocates 64 KiB clusters). Its file system may then turn read-only
// (the image mounts it errors=remount-ro), and a buffered writer may wait
// on pages that can no longer be written until its command's time limit;
// the VM, the host and the other VMs run on, and the VM's files are gone
// when it ends. The
// margin of OverlayLimit above the limit covers the file system's own
// writes (its journal, bitmaps, inode tables) so that an ordinary guest
// that fills its free space meets ENOSPC well before the hard bound.

// DefaultDiskMiB is Options.DiskMiB when it is 0: the policy's built-in
// disk_mib (policy.DefaultDiskMiB; a test checks that they agree).
const DefaultDiskMiB = 1024

// overlayMarginMiB is what OverlayLimit allows above the disk limit
// besides an eighth of it: the ext4 journal (64 MiB on images of 2 to 16
// GiB) that every metadata change writes through, a cold boot's own
// writes, qcow2's L2 and refcount tables.
const overlayMarginMiB = 128

// OverlayLimit is the hard bound, in bytes, of the overlay file of a VM
// whose disk limit is diskMiB on an image whose virtual disk is imageMiB
// (0: unknown): the limit, capped at the disk (a guest cannot hold more),
// plus an eighth of it and overlayMarginMiB for what the guest's file
// system writes besides its files' data and for 64 KiB clusters that
// partly written blocks allocate whole. It is pure.
func OverlayLimit(diskMiB, imageMiB int) uint64 {
	d := max(diskMiB, 0)
	if imageMiB > 0 {
		d = min(d, imageMiB)
	}
	return uint64(d+d/8+overlayMarginMiB) << 20
}

// ReserveFile is the file in the guest's root file system whose blocks
// are not the guest's to use: its size is the free space above the disk
// limit when the VM (or its template) booted. It belongs to root, mode
// 0400.
const ReserveFile = "/" + reserveName

const reserveName = ".vmgate-disk-reserve"

// reserveScript cuts the free space of the file system mounted at $2 (on
// the block device $3) to $1 MiB, as root, with a reserve file in $2
// named as ReserveFile. It prints what it did on stdout, a note on stderr
// when root's reserved blocks could not be given up (the unprivileged
// user then has that much less than the limit), exits 127 when the guest
// lacks a tool it needs, and fails when the reserve cannot be made.
const reserveScript = `set -eu
for t in stat fallocate; do
	command -v "$t" >/dev/null || { echo "the guest has no $t" >&2; exit 127; }
done
limit=$(($1 * 1048576))
f="${2%/}/` + reserveName + `"
# What both users may write once root's reserved blocks are given up (the
# free blocks less those ext4 keeps for itself); else what root may write.
field=%a
if ! tune2fs -r 0 "$3" >/dev/null 2>&1; then
	echo "tune2fs -r 0 $3 failed: root's reserved blocks are kept" >&2
	field=%f
fi
st=$(stat -f -c "$field %S" "$2")
set -- $st
free=$(($1 * $2))
n=$((free - limit))
if [ "$n" -le 0 ]; then
	echo "free=$free reserve=0"
	exit 0
fi
umask 0377 # the reserve is made 0400: one process less than chmod
fallocate -l "$n" "$f"
echo "free=$free reserve=$n"
`

// reserveArgv is the guest command that cuts the free space of the file
// system at dir, on device dev, to diskMiB.
func reserveArgv(diskMiB int, dir, dev string) []string {
	return []string{"sh", "-c", reserveScript, "vmgate-disk-reserve", strconv.Itoa(diskMiB), dir, dev}
}

// guestRootDevice is the guest's root file system (Cmdline's root=).
const guestRootDevice = "/dev/vda"

// reserveDisk is the boot step that cuts the guest's free space to the
// VM's disk limit (see "Disk limits" above), within the boot's time limit.
// A guest that lacks the tools (an imported image without stat or
// fallocate) is logged as a relaxation: it meets the host's hard bound,
// with I/O errors instead of ENOSPC. Any other failure fails the boot: a
// template saved without its reserve would hand that on to every clone.
func (l *launch) reserveDisk(ctx context.Context) error {
	v := l.vm
	var out, errOut strings.Builder
	res, err := v.Exec(ctx, ExecRequest{Argv: reserveArgv(l.opts.DiskMiB, "/", guestRootDevice), Stdout: &out, Stderr: &errOut, OutputLimit: 4 << 10})
	if err != nil {
		return fmt.Errorf("vm %s: disk limit: %w", v.ID, err)
	}
	msg := strings.TrimSpace(errOut.String())
	switch {
	case res.ExitCode == agentproto.ExitNotFound:
		v.log.Warn("RELAXATION: the guest's free space cannot be cut to its disk limit: past the limit its writes fail with I/O errors at the host's bound",
			"disk_mib", l.opts.DiskMiB, "why", msg)
	case res.ExitCode != 0 || res.Signal != "":
		// What the guest printed goes to the log, not into the error.
		v.log.Error("disk limit: the guest's reserve failed", "disk_mib", l.opts.DiskMiB, "exit", res.ShellExitCode(), "stderr", msg)
		return v.fail("boot", nil, fmt.Errorf("disk limit of %d MiB: the guest's reserve failed (exit %d)", l.opts.DiskMiB, res.ShellExitCode()))
	case msg != "":
		v.log.Warn("disk limit: "+msg, "disk_mib", l.opts.DiskMiB)
	}
	v.log.Debug("disk limit", "disk_mib", l.opts.DiskMiB, "guest", strings.TrimSpace(out.String()))
	return nil
}

// diskBound is the hard bound of the launch's overlay (OverlayLimit).
func (l *launch) diskBound() uint64 {
	return OverlayLimit(l.opts.DiskMiB, l.img.diskMiB)
}

// DiskBytes is what the VM's overlay takes on the host's disk now (its
// allocated blocks), or 0 when it cannot be read (the VM is gone).
func (v *VM) DiskBytes() int64 {
	if v.Dir == "" {
		return 0
	}
	return allocatedBytes(filepath.Join(v.Dir, OverlayFile))
}
