package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/integrity"
	"github.com/vmgate/vmgate/internal/testutil"
)

// TestSavePoint saves a running clone and restores copies from it: each
// copy has what the VM had at the save (files, a running process, its
// tmpfs), not what the VM did after; copies do not see each other's
// writes; each has its own random numbers and a fresh clock; a VM saved
// without keep is restored from its save point alone; a save point whose
// RAM or state changed is refused and leaves nothing; a discarded save
// point goes with its last VM. A fork point's digests, taken after its
// save, are those of its RAM and disk, for a VM saved from a template's
// RAM and for one resumed into a memory file of its own.
func TestSavePoint(t *testing.T) {
	img := testutil.RequiresImage(t)
	state := t.TempDir()
	opts := Options{Runtime: Runtime{StateDir: state, Accel: AccelAuto, TemplateDir: testutil.TemplateDir(t)}, ImageDir: img}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	tmpl, err := EnsureTemplate(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer tmpl.Close()
	p, err := tmpl.Restore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sh := func(v *VM, cmd string) execOut {
		t.Helper()
		return run(t, v, ExecRequest{Argv: []string{"sh", "-c", cmd}, Timeout: time.Minute})
	}
	// A background process counts; files on disk and in tmpfs.
	sh(p, "head -c 1048576 /dev/urandom > /root/data; sha256sum /root/data > /root/data.sum; echo shm > /dev/shm/s; "+
		"setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/count; sleep 0.2; done' </dev/null >/dev/null 2>&1 &")
	// This QEMU reports the agent's control queue, which a hand-back
	// watches.
	if q, err := dialQMP(ctx, filepath.Join(p.Dir, QMPSocket), p.exited); err != nil {
		t.Fatal(err)
	} else {
		_, _, err := controlQueue(ctx, q)
		q.Close()
		if err != nil {
			t.Fatalf("the agent's control queue: %v", err)
		}
	}
	sp, err := p.Save(ctx, filepath.Join(state, "sp1"), SaveOptions{Keep: true, InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("saved: %s; RAM %d MiB, disk %d MiB", phasesString(sp.Meta.Phases), sp.Meta.RAMDataBytes>>20, sp.Meta.OverlayBytes>>20)
	// The hand-back learnt of the agent's close from the control queue
	// (QEMU 7.2 and later report it), not by waiting for the port event
	// QEMU holds back for up to a second after the restore's. The event
	// may have come during the flatten, more than a second after the
	// restore, and been read there: the wait then never began.
	if by := p.handedBackBy; by != byControlQueue && by != byEarlierEvent {
		t.Errorf("the save learnt of the agent's close by %q, want %q (or %q)", by, byControlQueue, byEarlierEvent)
	}
	checkForkDigest(t, sp)
	if d := sp.Meta.DiskBytes(); d > int64(sp.Meta.MemoryMiB)<<20+sp.Meta.OverlayBytes+sp.Meta.StateBytes {
		t.Errorf("save point takes %d bytes", d)
	}
	// A fork's save point keeps its RAM in memory, not on disk.
	if _, err := os.Stat(filepath.Join(sp.Dir, RAMFile)); !errors.Is(err, os.ErrNotExist) || !sp.Meta.RAMInMemory || sp.Meta.RAMDataBytes < 1<<20 {
		t.Errorf("in-memory save point: RAM file %v, meta %+v", err, sp.Meta)
	}
	// The VM kept runs on, with a working agent, and writes after the save.
	if o := sh(p, "echo after > /root/after; cat /dev/shm/s"); o.stdout != "shm\n" {
		t.Fatalf("the VM after its save: %+v %q %q", o.res, o.stdout, o.stderr)
	}

	clock := func(what string, v *VM) {
		t.Helper()
		guest, err := strconv.ParseInt(strings.TrimSpace(sh(v, "date +%s").stdout), 10, 64)
		if d := time.Now().Unix() - guest; err != nil || d > 5 || d < -5 {
			t.Errorf("%s: clock %d (%v), host %d", what, guest, err, time.Now().Unix())
		}
	}
	copies := make([]*VM, 2)
	for i := range copies {
		if copies[i], err = sp.Restore(ctx, opts, true); err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		defer copies[i].Close()
		t.Logf("copy %d restored: %s", i, phasesString(copies[i].Phases()))
		clock("copy "+strconv.Itoa(i), copies[i])
	}
	a, b := copies[0], copies[1]
	for i, c := range copies {
		o := sh(c, "sha256sum -c /root/data.sum >/dev/null && cat /dev/shm/s && test ! -e /root/after && echo clean; "+
			"x=$(cat /dev/shm/count); sleep 1; y=$(cat /dev/shm/count); test $y -gt $x && echo counting")
		if o.stdout != "shm\nclean\ncounting\n" {
			t.Errorf("copy %d: %+v %q %q", i, o.res, o.stdout, o.stderr)
		}
	}
	rand := "head -c 32 /dev/urandom | od -An -tx1"
	if ra, rb := sh(a, rand), sh(b, rand); ra.stdout == rb.stdout {
		t.Errorf("two copies drew the same random bytes: %s", ra.stdout)
	}
	sh(a, "echo only-a > /root/a; echo only-a > /dev/shm/a; sync")
	if o := sh(b, "cat /root/a /dev/shm/a"); o.res.ExitCode == 0 {
		t.Errorf("copy b sees copy a's files: %q", o.stdout)
	}
	if o := sh(p, "cat /root/a"); o.res.ExitCode == 0 {
		t.Errorf("the saved VM sees a copy's file: %q", o.stdout)
	}
	if err := sp.Discard(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sp.Dir); err != nil {
		t.Errorf("a save point with VMs on it was removed: %v", err)
	}
	for _, c := range copies {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(sp.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the discarded save point outlived its VMs: %v", err)
	}

	// Saved without keep: the VM stays stopped; its save point alone
	// brings it back, the later work included.
	sp2, err := p.Save(ctx, filepath.Join(state, "sp2"), SaveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	sp2, err = OpenSavePoint(sp2.Dir)
	if err != nil {
		t.Fatal(err)
	}
	checkSavedDigests(t, sp2)
	if sp2.Meta.Format != savePointFormat || sp2.Meta.CheckKey == "" || sp2.Meta.RAMMAC == "" || sp2.Meta.StateMAC == "" || sp2.Meta.OverlayMAC == "" {
		t.Errorf("save point's checks: %+v", sp2.Meta)
	}
	r, err := sp2.Restore(ctx, opts, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("resumed: %s", phasesString(r.Phases()))
	clock("resumed", r)
	if o := sh(r, "cat /root/after /dev/shm/s; x=$(cat /dev/shm/count); sleep 1; y=$(cat /dev/shm/count); test $y -gt $x && echo counting"); o.stdout != "after\nshm\ncounting\n" {
		t.Errorf("resumed: %+v %q %q", o.res, o.stdout, o.stderr)
	}
	// A fork point of the resumed VM: its RAM copied from the VM's own
	// memory file, its digest taken after the save.
	spr, err := r.Save(ctx, filepath.Join(state, "spr"), SaveOptions{Keep: true, InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork point of the resumed VM: %s", phasesString(spr.Meta.Phases))
	c, err := spr.Restore(ctx, opts, true)
	if err != nil {
		t.Fatal(err)
	}
	if o := sh(c, "cat /root/after /dev/shm/s; sha256sum -c /root/data.sum >/dev/null && echo ok"); o.stdout != "after\nshm\nok\n" {
		t.Errorf("a copy of the resumed VM: %+v %q %q", o.res, o.stdout, o.stderr)
	}
	checkForkDigest(t, spr)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := spr.Discard(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(spr.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the discarded fork point outlived its VM: %v", err)
	}
	// Saving a VM restored from a save point folds that save point's
	// disk into its own.
	sp3, err := r.Save(ctx, filepath.Join(state, "sp3"), SaveOptions{Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	checkSavedDigests(t, sp3)
	if sp3.Meta.CheckKey == sp2.Meta.CheckKey || sp3.Meta.RAMMAC == "" {
		t.Errorf("save points' check keys: %s and %s, RAM check %q", short(sp2.Meta.CheckKey), short(sp3.Meta.CheckKey), sp3.Meta.RAMMAC)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := sp2.Discard(); err != nil {
		t.Fatal(err)
	}
	r3, err := sp3.Restore(ctx, opts, false)
	if err != nil {
		t.Fatalf("a save point of a resumed VM, without the one it was resumed from: %v", err)
	}
	if o := sh(r3, "cat /root/after; sha256sum -c /root/data.sum >/dev/null && echo ok"); o.stdout != "after\nok\n" {
		t.Errorf("resumed twice: %+v %q %q", o.res, o.stdout, o.stderr)
	}
	if err := r3.Close(); err != nil {
		t.Fatal(err)
	}

	// A damaged save point is refused, and nothing of the VM is left.
	for name, damage := range map[string]func(dir string) error{
		"RAM cut in half": func(dir string) error {
			return os.Truncate(filepath.Join(dir, RAMFile), int64(sp3.Meta.MemoryMiB)<<19)
		},
		"RAM changed": func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, RAMFile), os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			// A byte of the first page with data.
			var off int64
			err = dataExtents(f, func(o, _ int64) error {
				if off == 0 {
					off = o + 100
				}
				return nil
			})
			if err != nil {
				return err
			}
			b := make([]byte, 1)
			if _, err := f.ReadAt(b, off); err != nil {
				return err
			}
			b[0] ^= 0xff
			_, err = f.WriteAt(b, off)
			return err
		},
		// Whatever QEMU or the guest makes of it, the disk's digest names
		// the cause.
		"disk changed": func(dir string) error {
			path := filepath.Join(dir, OverlayFile)
			st, err := os.Stat(path)
			if err != nil {
				return err
			}
			_, err = writeAt(path, []byte("garbage"), st.Size()/2)
			return err
		},
		"state changed": func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, TemplateStateFile), os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteAt([]byte("garbage"), 100)
			return err
		},
	} {
		dir := filepath.Join(state, "damaged")
		_ = os.RemoveAll(dir)
		if err := copyTree(sp3.Dir, dir); err != nil {
			t.Fatal(err)
		}
		if err := damage(dir); err != nil {
			t.Fatal(err)
		}
		d, err := OpenSavePoint(dir)
		if err == nil {
			var v *VM
			if v, err = d.Restore(ctx, opts, false); err == nil {
				v.Close()
			}
		}
		if !errors.Is(err, ErrSavePointDamaged) {
			t.Errorf("%s: %v, want ErrSavePointDamaged", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
	if err := sp3.Discard(); err != nil {
		t.Fatal(err)
	}
	assertNoVMs(t, state)
}

// copyTree copies the regular files of src into a new directory dst.
func copyTree(src, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := copySparse(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// checkSavedDigests checks the digests of a save point on disk, taken
// with its keyed checks, against digests of its files read in full: they
// name it in the audit log, and a restore checks the keyed checks only.
func checkSavedDigests(t *testing.T, sp *SavePoint) {
	t.Helper()
	ram, err := os.ReadFile(filepath.Join(sp.Dir, RAMFile))
	if err != nil {
		t.Fatal(err)
	}
	d := integrity.NewPageDigest()
	if err := d.Add(0, ram); err != nil {
		t.Fatal(err)
	}
	if d.Sum() != sp.Meta.RAMSHA256 {
		t.Errorf("%s: RAM digest %s, its file's is %s", sp.Dir, short(sp.Meta.RAMSHA256), short(d.Sum()))
	}
	for file, want := range map[string]string{OverlayFile: sp.Meta.OverlaySHA256, TemplateStateFile: sp.Meta.StateSHA256} {
		if got, err := integrity.FileSHA256(filepath.Join(sp.Dir, file)); err != nil || got != want {
			t.Errorf("%s: %s digest %s, its file's is %s (%v)", sp.Dir, file, short(want), short(got), err)
		}
	}
}

// checkForkDigest checks a fork point's Digest, and the digests in its
// metadata file, against digests of its sealed RAM and its disk read in
// full.
func checkForkDigest(t *testing.T, sp *SavePoint) {
	t.Helper()
	m := sp.Meta
	d := integrity.NewPageDigest()
	buf := make([]byte, 16<<20)
	for off := int64(0); off < int64(m.MemoryMiB)<<20; off += int64(len(buf)) {
		if _, err := sp.ram.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if err := d.Add(off, buf); err != nil {
			t.Fatal(err)
		}
	}
	disk, err := os.ReadFile(filepath.Join(sp.Dir, OverlayFile))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(disk)
	m.RAMSHA256, m.OverlaySHA256 = d.Sum(), hex.EncodeToString(sum[:])
	if got := sp.Digest(); got != m.Digest() {
		t.Errorf("fork point's digest %q, want %q", got, m.Digest())
	}
	var file SavePointMeta
	if b, err := os.ReadFile(filepath.Join(sp.Dir, SavePointMetaFile)); err != nil || json.Unmarshal(b, &file) != nil ||
		file.RAMSHA256 != m.RAMSHA256 || file.OverlaySHA256 != m.OverlaySHA256 {
		t.Errorf("fork point's %s: %+v (%v), want the digests of RAM %s and disk %s", SavePointMetaFile, file, err, short(m.RAMSHA256), short(m.OverlaySHA256))
	}
}
