package vm

// Save points. A save point is a running VM saved to files, in a
// template's layout: overlay.qcow2 (its disk, on the image's base alone),
// ram (its guest RAM, a sparse file), state (its device state without
// RAM) and savepoint.json (what it was saved from, and the digests of
// those files). VMs are restored from it as clones are from a template:
// a new overlay on its disk, its RAM mapped private copy-on-write from a
// sealed memory copy of the file, the state loaded, the clock and entropy
// refreshed. A paused session is one save point; a fork is one save
// point, whose RAM stays in a sealed memory file instead of a file, with
// a VM restored from it per copy, all mapping that memory file, so that
// the copies share the pages none of them wrote.
//
// How a VM is saved (saving.go): its QEMU migrates it into a pipe, and
// vmgated splits that stream into the RAM image and the device state
// (package migstream), which QEMU loads as it loads a template's.
//
// Threat model. The VM saved may be hostile: its guest wrote its disk
// and RAM, and a guest that took over its QEMU wrote every byte of the
// overlay's qcow2 metadata and of the migration stream. The host never
// parses the disk: it is folded (block-stream) by the VM's own QEMU in
// its jail and linked or copied as bytes, and a new overlay on it is made
// without opening it (createOverlayOf). The stream is read by migstream,
// which bounds every length and offset and interprets nothing but the
// framing of the RAM's pages (its threat model); only a jailed QEMU loads
// what it wrote. The files are 0600 in a 0700 directory of vmgated's
// state directory. When saved, each file gets its SHA-256 (which names
// the save point in the audit log) and a keyed check (integrity.MAC,
// under a key drawn for that save point: SavePointMeta.CheckKey); the
// keyed checks, four times cheaper, are checked before a VM is restored,
// so a file changed, cut or taken from another save point afterwards (a
// damaged disk, a full one) is found and refused (ErrSavePointDamaged).
// The guest never learns the key (a restored VM's jail shows its QEMU
// the save point's disk alone: restoreMode), so it cannot fill its RAM so
// that a changed copy passes; anyone who can read savepoint.json is
// vmgated's user, who could rewrite the digests as well. A fork's save
// point, whose copies are restored from it at once, is not checked
// again: its files are the daemon's of a moment ago, and its digests,
// which only name it in the audit log, are taken while its copies are
// restored (SavePoint.Digest). A save point is
// restored only into the machine it was saved from: the same image, QEMU,
// accelerator and shape (ErrSavePointStale otherwise).

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vmgate/vmgate/internal/durable"
	"github.com/vmgate/vmgate/internal/integrity"
)

// Files of a save point (with OverlayFile, RAMFile, TemplateStateFile).
const (
	SavePointMetaFile = "savepoint.json"
	// savePointFormat 3: the files are checked at a restore by their keyed
	// checks (CheckKey); 2: by their SHA-256, the RAM's being
	// integrity.PageDigest's; 1: the RAM's integrity.ExtentSHA256's. All three are
	// read.
	savePointFormat = 3
)

// ErrSavePointStale reports a save point that this host cannot restore
// as it was saved: another image, QEMU, accelerator or machine shape.
var ErrSavePointStale = errors.New("save point does not match this machine")

// ErrSavePointDamaged reports a save point whose files are missing, cut
// or changed since it was saved.
var ErrSavePointDamaged = errors.New("save point damaged")

// SavePointMeta describes a save point: what it can be restored into (its
// Machine, and the launch's format), and its files.
type SavePointMeta struct {
	Format int `json:"format"`
	Machine
	// Launch is the format of the QEMU command line the VM ran with
	// (templateFormat: devices, CPU model, kernel arguments).
	Launch  int       `json:"launch_format"`
	SavedAt time.Time `json:"saved_at"`
	Phases  []Phase   `json:"phases"`
	// RAMInMemory: the RAM is in a memory file the save point holds (a
	// fork's), not in RAMFile.
	RAMInMemory bool `json:"ram_in_memory,omitempty"`
	// Digests of the files (RAM: of its pages that are not all zeros and
	// their offsets, integrity.PageDigest; in format 1 of its data extents
	// and their offsets, integrity.ExtentSHA256), and their sizes on disk.
	OverlaySHA256 string `json:"overlay_sha256"`
	StateSHA256   string `json:"state_sha256"`
	RAMSHA256     string `json:"ram_sha256"`
	OverlayBytes  int64  `json:"overlay_bytes"`
	StateBytes    int64  `json:"state_bytes"`
	RAMDataBytes  int64  `json:"ram_data_bytes"`
	// CheckKey (hex; format 3, not a fork point's) is the key of the
	// files' keyed checks (integrity.MAC; the RAM's by its pages that are
	// not all zeros, integrity.NewPageCheck; the others' whole,
	// integrity.FileMAC), which a restore checks instead of the digests:
	// four times cheaper, and the digests taken with them at the save
	// still name what ran.
	CheckKey   string `json:"check_key,omitempty"`
	OverlayMAC string `json:"overlay_mac,omitempty"`
	StateMAC   string `json:"state_mac,omitempty"`
	RAMMAC     string `json:"ram_mac,omitempty"`
}

// checkKey is the key of the save point's keyed checks, nil before
// format 3.
func (m SavePointMeta) checkKey() ([]byte, error) {
	if m.Format < 3 {
		return nil, nil
	}
	k, err := hex.DecodeString(m.CheckKey)
	if err != nil || len(k) != integrity.KeySize {
		return nil, fmt.Errorf("%w: %s: no check key of %d bytes", ErrSavePointDamaged, SavePointMetaFile, integrity.KeySize)
	}
	return k, nil
}

// Digest names the save point's content: a digest of its files' digests
// and of the machine it belongs to (for the audit log).
func (m SavePointMeta) Digest() string {
	h := sha256.New()
	fmt.Fprintf(h, "format=%d\nimage=%s\nkernel=%s\ninitrd=%s\nmem=%d\ncpus=%d\naccel=%s\nqemu=%s\nnetwork=%v\noverlay=%s\nstate=%s\nram=%s\n",
		m.Format, m.ImageDigest, m.KernelDigest, m.InitrdDigest, m.MemoryMiB, m.CPUs, m.Accel, m.QEMUVersion, m.Network,
		m.OverlaySHA256, m.StateSHA256, m.RAMSHA256)
	return hex.EncodeToString(h.Sum(nil))
}

// write writes the metadata file (SavePointMetaFile, 0400) into dir.
func (m SavePointMeta) write(dir string) error {
	b, _ := json.MarshalIndent(m, "", "  ")
	return durable.WriteNew(filepath.Join(dir, SavePointMetaFile), append(b, '\n'), 0o400)
}

// DiskBytes is the space the save point's files take.
func (m SavePointMeta) DiskBytes() int64 { return m.OverlayBytes + m.StateBytes + m.RAMDataBytes }

// SavePoint is a save point on disk. VMs restored from it hold a
// reference each; Discard removes its files once none is left.
type SavePoint struct {
	Meta SavePointMeta
	Dir  string

	mu      sync.Mutex
	refs    int
	discard bool
	ram     *os.File // the sealed copy of its RAM that shared restores map
	// ramDropped: its RAM file was removed (DropRAMFile).
	ramDropped bool
	// A fork point's digests are taken after its save (takeDigests):
	// digested is closed once they are, and whole is then its metadata
	// with them (nil if they could not be taken).
	digested chan struct{}
	whole    *SavePointMeta
}

// Digest names the save point's content (SavePointMeta.Digest), for the
// audit log. A fork point's is taken after its save, beside its copies'
// restores, which do not check it (see the package doc): Digest waits for
// it, and is empty if it could not be taken.
func (sp *SavePoint) Digest() string {
	if sp.digested == nil {
		return sp.Meta.Digest()
	}
	<-sp.digested
	if sp.whole == nil {
		return ""
	}
	return sp.whole.Digest()
}

// takeDigests takes the digests that a fork point's save left out, of its
// sealed RAM (unless the migration stream gave it) and of its disk, and
// writes its metadata with them.
func (sp *SavePoint) takeDigests(log *slog.Logger) {
	defer close(sp.digested)
	m := sp.Meta
	var err error
	if m.RAMSHA256 == "" {
		d := integrity.NewPageDigest()
		if err = readPages(sp.ram, d.Add); err == nil {
			m.RAMSHA256 = d.Sum()
		}
	}
	if err == nil {
		m.OverlaySHA256, err = integrity.FileSHA256(filepath.Join(sp.Dir, OverlayFile))
	}
	if err == nil {
		err = m.write(sp.Dir)
	}
	if err != nil {
		log.Warn("the fork point's digests could not be taken", "dir", sp.Dir, "err", err)
		return
	}
	sp.whole = &m
}

// OpenSavePoint reads the save point in dir and checks that its files are
// there with the sizes it recorded; their digests are checked when a VM
// is restored from it.
func OpenSavePoint(dir string) (*SavePoint, error) {
	b, err := os.ReadFile(filepath.Join(dir, SavePointMetaFile))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSavePointDamaged, err)
	}
	var m SavePointMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrSavePointDamaged, SavePointMetaFile, err)
	}
	if m.Format < 1 || m.Format > savePointFormat {
		return nil, fmt.Errorf("%w: saved in format %d, this vmgated reads 1 to %d", ErrSavePointStale, m.Format, savePointFormat)
	}
	if m.RAMInMemory {
		return nil, fmt.Errorf("%w: its RAM was kept in memory by the daemon that saved it", ErrSavePointDamaged)
	}
	if _, err := m.checkKey(); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		file string
		size int64
	}{{OverlayFile, -1}, {TemplateStateFile, m.StateBytes}, {RAMFile, int64(m.MemoryMiB) << 20}} {
		st, err := os.Stat(filepath.Join(dir, c.file))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSavePointDamaged, err)
		}
		if c.size >= 0 && st.Size() != c.size {
			return nil, fmt.Errorf("%w: %s is %d bytes, it was saved with %d", ErrSavePointDamaged, c.file, st.Size(), c.size)
		}
	}
	return &SavePoint{Meta: m, Dir: dir}, nil
}

// acquire takes a reference for a VM restored from the save point.
func (sp *SavePoint) acquire() {
	sp.mu.Lock()
	sp.refs++
	sp.mu.Unlock()
}

// release drops a reference, removing the files of a discarded save
// point with the last one.
func (sp *SavePoint) release() error {
	sp.mu.Lock()
	sp.refs--
	gone := sp.discard && sp.refs == 0
	sp.mu.Unlock()
	if gone {
		return sp.remove()
	}
	return nil
}

// Discard removes the save point's files now, or once the last VM
// restored from it is closed. Safe to call twice.
func (sp *SavePoint) Discard() error {
	sp.mu.Lock()
	if sp.discard {
		sp.mu.Unlock()
		return nil
	}
	sp.discard = true
	gone := sp.refs == 0
	sp.mu.Unlock()
	if gone {
		return sp.remove()
	}
	return nil
}

// DropShared lets go of the sealed copy of the RAM that shared restores
// map: the VMs restored from it keep their own mappings, and a later
// shared restore makes a new copy. A paused session forked once need not
// hold a copy of its RAM in memory until it ends.
func (sp *SavePoint) DropShared() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.ram != nil && !sp.Meta.RAMInMemory {
		_ = sp.ram.Close()
		sp.ram = nil
	}
}

// DropRAMFile gives up the RAM file of a save point whose VM was resumed
// and is its only one: the VM maps a memory copy of it, and the save point
// lives on only as its disk's backing, until the VM is saved again or
// ends. It can no longer be restored from once DropRAMFile returns. The
// disk it frees is the RAM's data: the session it belongs to does not hold
// its RAM twice.
//
// The file is removed by remove, which the caller runs when nothing waits
// for it: on the benchmark's host (ext4 mounted with online discard),
// removing a RAM image of 240 MiB took 160-210 ms, and a command that
// ended beside the removal took 100-200 ms longer (docs/benchmarks.md).
// remove is safe to run after the save point's own removal, and more
// than once.
func (sp *SavePoint) DropRAMFile() (remove func() error) {
	sp.mu.Lock()
	sp.ramDropped = true
	sp.mu.Unlock()
	return func() error {
		if err := os.Remove(filepath.Join(sp.Dir, RAMFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("drop save point RAM: %w", err)
		}
		return nil
	}
}

func (sp *SavePoint) remove() error {
	if sp.digested != nil {
		<-sp.digested // they read its files
	}
	sp.mu.Lock()
	if sp.ram != nil {
		_ = sp.ram.Close()
		sp.ram = nil
	}
	sp.mu.Unlock()
	if err := os.RemoveAll(sp.Dir); err != nil {
		return fmt.Errorf("remove save point: %w", err)
	}
	return nil
}

// Matches reports whether VMs of opts (the image, the runtime's QEMU, the
// shape) and accelerator accel are the machine the save point was saved
// from, launched as it was; an error wrapping ErrSavePointStale names the
// first difference (Machine.diff).
func (sp *SavePoint) Matches(opts Options, accel Accel) error {
	now, err := machineOf(opts, accel)
	if err != nil {
		return err
	}
	d := difference("the VM's launch (vmgated's version)", sp.Meta.Launch, templateFormat)
	if d == "" {
		d = sp.Meta.diff(now)
	}
	if d != "" {
		return fmt.Errorf("%w: %s", ErrSavePointStale, d)
	}
	return nil
}
