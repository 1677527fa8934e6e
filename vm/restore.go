package vm

// A save point's restore (SavePoint.Restore): its steps, its RAM's copy
// and the check of its files.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/vmgate/vmgate/internal/integrity"
)

// restoreSteps bring a VM up from a save point: the save point checked
// against the machine first (validate), its state opened and its RAM
// made ready, with the RAM's copy begun (open), a clone's launch, its
// state loaded once the RAM is filled, and the VM handed over once the
// save point's files passed their checks (begun once the RAM is filled).
var restoreSteps = slices.Concat(
	[]step{{name: "validate", run: (*launch).validate, ownLimit: true}, {name: "open", run: (*launch).openSaved}},
	aheadSteps,
	[]step{{name: "fill", run: (*launch).fill}},
	completeSteps,
	[]step{{name: "verify", run: (*launch).verify}},
)

// Restore starts a VM from the save point with opts (the runtime, the
// cgroups, the network's configuration; its image and shape must be the
// save point's: Matches), its clock and entropy refreshed. shared maps the
// RAM through one sealed copy that the save point keeps, for several VMs
// (a fork's copies); otherwise the VM maps the RAM file itself.
//
// Postcondition: on error nothing of the VM is left, and the save point is
// as it was.
func (sp *SavePoint) Restore(ctx context.Context, opts Options, shared bool) (*VM, error) {
	opts.setRestoreDefaults(&sp.Meta.Machine)
	// A failed check of the save point's files stops the launch at once.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l := launchOf(opts)
	l.saved = &restoring{sp: sp, shared: shared || sp.Meta.RAMInMemory, stop: cancel}
	v, err := l.finish(ctx, restoreSteps)
	if err != nil {
		// A failed check is why the launch stopped, or the better reason
		// for whatever went wrong after the damaged state loaded.
		return nil, cmp.Or(l.saved.wait(), err)
	}
	return v, nil
}

// restoring is what a launch from a save point holds beside a clone's:
// the save point, how its RAM is mapped, and the check of its files,
// which runs beside the launch's steps.
type restoring struct {
	sp *SavePoint
	// shared: the VM maps the save point's sealed copy of its RAM, as
	// other VMs do (a fork's copies); otherwise a copy of its own.
	shared bool
	stop   context.CancelCauseFunc // ends the launch's context
	// checked is closed once err, the result of the RAM's copy and the
	// files' check, is set; nil until they begin (open).
	checked chan struct{}
	err     error
}

// wait waits for the copy and the check of the save point's files, if
// they began, and returns their error: they read its files, and are done
// before the caller acts on them.
func (r *restoring) wait() error {
	if r.checked == nil {
		return nil
	}
	<-r.checked
	return r.err
}

// validate checks that the save point can be restored with the launch's
// options: its RAM is still there, the image is whole and the
// accelerator resolved, and they are the machine the save point was saved
// on (SavePoint.Matches). The launch takes the image and accelerator.
func (l *launch) validate(ctx context.Context) error {
	sp := l.saved.sp
	sp.mu.Lock()
	dropped := sp.ramDropped && sp.ram == nil
	sp.mu.Unlock()
	if dropped {
		return errors.New("restore: the save point's RAM was dropped once its VM ran")
	}
	img, accel, err := prepare(ctx, l.opts)
	if err != nil {
		return err
	}
	if err := sp.Matches(l.opts, accel); err != nil {
		return err
	}
	l.setImage(img, accel)
	return nil
}

// openSaved opens the save point's state for QEMU and makes its RAM
// ready (restoreRAM), sets the launch's mode (restoreMode), takes a
// reference to the save point for the VM, and begins the RAM's copy and
// the files' check beside the next steps (checkFiles).
func (l *launch) openSaved(context.Context) error {
	sp := l.saved.sp
	state, err := os.Open(filepath.Join(sp.Dir, TemplateStateFile))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSavePointDamaged, err)
	}
	l.owned = append(l.owned, state)
	ram, err := sp.restoreRAM(l.saved.shared)
	if err != nil {
		return err
	}
	if ram.own != nil {
		l.vm.ram = ram.own
		l.vm.push(ram.own.Close)
		l.owned = append(l.owned, ram.file) // QEMU's mapping keeps it
	}
	l.setMode(sp.restoreMode(l.img, ram, state))
	sp.acquire()
	l.vm.from = sp
	l.vm.push(sp.release) // runs last: after QEMU and the VM's files are gone
	l.filled, l.verified = l.saved.checkFiles(ram.fill)
	return nil
}

// restoredRAM is the memory a VM restored from a save point maps as its
// RAM (QEMU's fd 4).
type restoredRAM struct {
	file *os.File
	mode ramMode
	// fill and own are two more descriptors of a VM's own copy (nil for
	// the shared one): the first to fill it through (checkFiles), the
	// second kept by the VM for its next save (VM.ram).
	fill, own *os.File
}

// restoreRAM makes the memory a VM restored from the save point maps as
// its RAM. It is a memory copy of the file: QEMU reading a file's holes
// (the guest's zero pages) through its mapping costs more than the copy
// when the VM is saved again (docs/benchmarks.md). VMs that share it (a
// fork's copies) map one sealed copy privately, made and checked on
// first use. A VM alone gets a copy of its own, which its QEMU maps
// shared, so that its guest writes there and a save copies that file
// (VM.ram) instead of migrating the RAM page by page; it is filled while
// QEMU starts: QEMU, waiting for its state, does not touch the guest's
// RAM before the state loads, which waits for the fill.
func (sp *SavePoint) restoreRAM(shared bool) (restoredRAM, error) {
	if shared {
		ram, err := sp.sealedRAM()
		return restoredRAM{file: ram, mode: ramPrivateFD}, err
	}
	ram, err := memFile("vmgate-vm-ram", int64(sp.Meta.MemoryMiB)<<20)
	if err != nil {
		return restoredRAM{}, err
	}
	r := restoredRAM{file: ram, mode: ramSharedFD}
	if r.fill, err = dupFile(ram); err == nil {
		if r.own, err = dupFile(ram); err != nil {
			r.fill.Close()
		}
	}
	if err != nil {
		ram.Close()
		return restoredRAM{}, err
	}
	return r, nil
}

// restoreMode is how a VM restored from the save point is launched: a
// new overlay on the save point's disk (written by a VM's QEMU: never
// opened by the host), ram and state as QEMU's fds 4 and 5, and in its
// jail the image's files and the save point's disk, the one file of it
// that QEMU opens. The save point's directory is not bound: its
// savepoint.json holds the key of its keyed checks, which the guest
// never learns, and its RAM file and state reach QEMU as fds only. It is
// pure.
func (sp *SavePoint) restoreMode(img *imageFiles, ram restoredRAM, state *os.File) launchMode {
	disk := filepath.Join(sp.Dir, OverlayFile)
	return launchMode{backing: disk, untrustedBacking: true, readOnly: append(img.qemuFiles(), disk),
		ram: ram.mode, files: []*os.File{ram.file, state}, restore: true}
}

// checkFiles copies the save point's RAM into fill, a VM's own copy
// (nil: the shared copy, checked when it was made), and then checks the
// save point's files, beside the launch's steps, which wait for the copy
// (filled: the fill step) and for the check (verified: the verify step).
// The files are checked once the RAM is filled, while the state loads
// and the guest resumes, so that the checks do not take the host's CPUs
// from the fill and QEMU's start. A check that fails stops the launch at
// once (stop). A save point of a format before 3 has its RAM's digest
// checked as it is copied.
//
// Loading before the check relaxes nothing: the check is against damage
// (only vmgated's user can write these files), and a damaged file
// reaches only the jailed QEMU and its guest, as any guest's input does
// (docs/security.md).
func (r *restoring) checkFiles(fill *os.File) (filled, verified <-chan error) {
	filledc, verifiedc := make(chan error, 1), make(chan error, 1)
	r.checked = make(chan struct{})
	go func() {
		defer close(r.checked)
		var err error
		if fill != nil {
			err = r.sp.fillRAM(fill, false, true)
			fill.Close()
		}
		filledc <- err
		if err == nil && !r.sp.Meta.RAMInMemory {
			err = r.sp.verify(fill != nil)
		}
		if err != nil {
			r.stop(err)
		}
		r.err = err
		verifiedc <- err
	}()
	return filledc, verifiedc
}

// verify checks the save point's state and disk, and its RAM if ram and
// the save point has keyed checks (format 3; an older one's RAM is checked
// as it is copied: fillRAM), reading them through files of their own: by
// their keyed checks, or by their digests before format 3.
func (sp *SavePoint) verify(ram bool) error {
	key, err := sp.Meta.checkKey()
	if err != nil {
		return err
	}
	type check struct {
		file, want string
		sum        func(*os.File) (string, error)
	}
	sha := func(f *os.File) (string, error) { return integrity.ReaderSHA256(f) }
	checks := []check{{OverlayFile, sp.Meta.OverlaySHA256, sha}, {TemplateStateFile, sp.Meta.StateSHA256, sha}}
	if key != nil {
		checks = []check{
			{OverlayFile, sp.Meta.OverlayMAC, func(f *os.File) (string, error) { return integrity.ReaderMAC(f, key, integrity.DomainOverlay) }},
			{TemplateStateFile, sp.Meta.StateMAC, func(f *os.File) (string, error) { return integrity.ReaderMAC(f, key, integrity.DomainState) }},
		}
		if ram {
			checks = append(checks, check{RAMFile, sp.Meta.RAMMAC, func(f *os.File) (string, error) { return ramMAC(f, key) }})
		}
	}
	// The files are read at once: a restore waits for the longest.
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() {
			f, err := os.Open(filepath.Join(sp.Dir, c.file))
			if err != nil {
				errs[i] = fmt.Errorf("%w: %w", ErrSavePointDamaged, err)
				return
			}
			got, err := c.sum(f)
			f.Close()
			switch {
			case err != nil:
				errs[i] = fmt.Errorf("%w: %s: %w", ErrSavePointDamaged, c.file, err)
			case got != c.want:
				errs[i] = changed(c.file, key != nil, got, c.want)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// changed is the error of a save point's file whose digest, or keyed
// check (mac), is not what was saved.
func changed(file string, mac bool, got, want string) error {
	kind := "sha256"
	if mac {
		kind = "check"
	}
	return fmt.Errorf("%w: %s has changed since it was saved (%s %s, saved as %s)", ErrSavePointDamaged, file, kind, short(got), short(want))
}

// sealedRAM is the sealed copy of the save point's RAM that shared
// restores map, made (and its digest checked) on first use.
func (sp *SavePoint) sealedRAM() (*os.File, error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.ram != nil {
		return sp.ram, nil
	}
	ram, err := sp.copyRAM()
	if err != nil {
		return nil, err
	}
	sp.ram = ram
	return ram, nil
}

// copyRAM copies the save point's RAM file into a new sealed memory file,
// checking its digest as it reads it (one pass).
func (sp *SavePoint) copyRAM() (*os.File, error) {
	dst, err := memFile("vmgate-savepoint-ram", int64(sp.Meta.MemoryMiB)<<20)
	if err != nil {
		return nil, err
	}
	if err := sp.fillRAM(dst, true, false); err != nil {
		dst.Close()
		return nil, err
	}
	return dst, nil
}

// fillRAM copies the save point's RAM file into dst, a new memory file of
// its size, checking the file's digest as it reads it (one pass), and
// seals dst if sealed. With late, a format-3 save point's RAM is only
// copied, for the caller to check it apart (verify); an older format's is
// checked as it is copied regardless.
func (sp *SavePoint) fillRAM(dst *os.File, sealed, late bool) error {
	src, err := os.Open(filepath.Join(sp.Dir, RAMFile))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSavePointDamaged, err)
	}
	defer src.Close()
	size := int64(sp.Meta.MemoryMiB) << 20
	if st, err := src.Stat(); err != nil || st.Size() != size {
		return fmt.Errorf("%w: %s is not %d bytes (%v)", ErrSavePointDamaged, RAMFile, size, err)
	}
	key, err := sp.Meta.checkKey()
	if err != nil {
		return err
	}
	var got, want string
	switch {
	case key != nil && late:
		_, err = copyRAMImage(dst, src)
	case key != nil:
		var d *integrity.PageDigest
		if d, err = integrity.NewPageCheck(key, false); err == nil {
			_, err = copyRAMImage(dst, src, d)
			got = d.MAC()
		}
		want = sp.Meta.RAMMAC
	case sp.Meta.Format == 1:
		// Its digest is of the file's extents.
		if got, err = integrity.ExtentSHA256(src, func(fn func(off, n int64) error) error { return dataExtents(src, fn) }); err == nil {
			err = readPages(src, func(off int64, p []byte) error { _, err := dst.WriteAt(p, off); return err })
		}
		want = sp.Meta.RAMSHA256
	default:
		d := integrity.NewPageDigest()
		_, err = copyRAMImage(dst, src, d)
		got, want = d.Sum(), sp.Meta.RAMSHA256
	}
	switch {
	case err != nil:
		return fmt.Errorf("%w: %s: %w", ErrSavePointDamaged, RAMFile, err)
	case got != want:
		return changed(RAMFile, key != nil, got, want)
	case sealed:
		return seal(dst)
	}
	return nil
}

// ramMAC is the keyed check of the RAM file f (integrity.MAC of its
// nonzero pages under key), read by its data extents.
func ramMAC(f *os.File, key []byte) (string, error) {
	d, err := integrity.NewPageCheck(key, false)
	if err != nil {
		return "", err
	}
	if err := readPages(f, d.Add); err != nil {
		return "", err
	}
	return d.MAC(), nil
}

// readPages reads f's data extents (SEEK_DATA/SEEK_HOLE) in whole pages,
// in order, up to 1 MiB at a time, and gives each run to fn (its
// offset and bytes; the bytes are reused after fn returns).
func readPages(f *os.File, fn func(off int64, p []byte) error) error {
	buf := make([]byte, 1<<20)
	return readPagesInto(f, func() []byte { return buf }, fn)
}

// readPagesInto is readPages reading each run into a buffer of next's
// (1 MiB, or more); fn then owns it.
func readPagesInto(f *os.File, next func() []byte, fn func(off int64, p []byte) error) error {
	done := int64(0) // what was read: extents are read in whole pages
	return dataExtents(f, func(off, n int64) error {
		end := (off + n + integrity.PageSize - 1) &^ (integrity.PageSize - 1)
		off = max(off&^(integrity.PageSize-1), done)
		done = max(done, end)
		for off < end {
			buf := next()
			k := min(int64(len(buf)), end-off)
			if _, err := f.ReadAt(buf[:k], off); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			if err := fn(off, buf[:k]); err != nil {
				return err
			}
			off += k
		}
		return nil
	})
}
