package vm

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/internal/durable"
	"github.com/vmgate/vmgate/internal/integrity"
	"github.com/vmgate/vmgate/vm/migstream"
)

// ramBlock is the id of the guest RAM's block in QEMU (the memory
// backend's, qemu.go).
const ramBlock = "ram"

// Saving a VM into a save point is a list of named steps over one value,
// as a launch is: each step's time is a phase of the save point
// (SavePointMeta.Phases).
var saveSteps = []saveStep{
	{"hang_up", (*saving).hangUp},
	{"flatten", (*saving).flatten},
	{"hand_over", (*saving).handOver},
	{"stop", (*saving).stop},
	{"disk", (*saving).copyDisk},
	{"stream", (*saving).stream},
	{"sync", (*saving).sync},
	{"resume", (*saving).resume},
	{"seal", (*saving).seal},
}

type saveStep struct {
	name string
	run  func(*saving, context.Context) error
}

// saving is one save of a running VM.
type saving struct {
	v   *VM
	dir string // the save point's directory, once whole
	tmp string // where it is written
	o   SaveOptions

	q       *qmp     // the VM's monitor
	stopped bool     // the guest is stopped (and runs again on failure)
	away    bool     // the agent connection was handed back
	ram     *os.File // the RAM image: a file in tmp, or a memory file (InMemory)
	key     []byte   // the key of the files' keyed checks (none InMemory)
	meta    SavePointMeta
	overlay chan digest // the disk's digest, taken while the RAM is saved
	copied  chan error  // the disk's copy is made (copyDisk)
	// hungUp is where the hand-back began; handedBack is set by q's
	// onEvent once the guest agent's port event came (flatten runs
	// meanwhile).
	hungUp     handBackMark
	handedBack bool
	// noHandBack: the guest agent did not close and reopen its port in
	// time; it will not take a new connection either (undo).
	noHandBack error
}

type digest struct {
	sum, mac string // the SHA-256 and the keyed check
	err      error
}

// saveTimeout bounds a save: a migration of the guest's RAM through a
// pipe, a copy of its disk.
const saveTimeout = 2 * time.Minute

// SaveOptions says what a save keeps.
type SaveOptions struct {
	// Keep lets the VM run on after the save (a fork's parent);
	// otherwise it is left stopped, for the caller to close (a pause).
	Keep bool
	// InMemory keeps the RAM in a sealed memory file that the save point
	// holds, not on disk, for a save point that does not outlive the
	// daemon (a fork's: its copies map that file). Its other files are
	// on disk as always.
	InMemory bool
}

// Save writes the running VM to a new save point in dir (which must not
// exist; its parent must). Its guest is stopped for the time of it and
// runs again afterwards with o.Keep; otherwise it is left stopped, for
// the caller to close. The VM must be idle: no command runs in it.
//
// How: the agent's connection is handed back, so that the guest agent
// waits for a new host on a reopened port, as in a template; the VM's
// disk is flattened onto the image's base (block-stream: a template's or
// save point's disk folded in, so that the save point needs nothing but
// the image); the guest stops and its overlay is copied; its QEMU
// migrates it into a pipe, from which vmgated splits the guest's RAM into
// a RAM image (package migstream: a sparse file, or a memory file) and
// keeps the rest as the device state, which loads as a template's does.
//
// Postcondition: on error nothing of the save point is left, and a VM
// that ran runs again (with a new agent connection).
func (v *VM) Save(ctx context.Context, dir string, o SaveOptions) (*SavePoint, error) {
	ctx, cancel := context.WithTimeout(ctx, saveTimeout)
	defer cancel()
	s := &saving{v: v, dir: dir, tmp: dir + ".partial", o: o}
	if err := os.Mkdir(s.tmp, 0o700); err != nil {
		return nil, fmt.Errorf("save: %w", err)
	}
	s.meta = SavePointMeta{Format: savePointFormat, Launch: templateFormat, RAMInMemory: o.InMemory}
	if !o.InMemory {
		// A fork point is never restored from its files alone: its copies
		// are restored at once, without a check (SavePoint.Digest).
		s.key = make([]byte, integrity.KeySize)
		_, _ = rand.Read(s.key) // never fails (crypto/rand)
		s.meta.CheckKey = hex.EncodeToString(s.key)
	}
	t0 := time.Now()
	mark := t0
	var err error
	for _, st := range saveSteps {
		if err = st.run(s, ctx); err != nil {
			err = fmt.Errorf("save %s: %w", st.name, err)
			break
		}
		now := time.Now()
		s.meta.Phases = append(s.meta.Phases, Phase{st.name, now.Sub(mark)})
		mark = now
	}
	s.close()
	if err != nil {
		if cerr := s.awaitCopy(); cerr != nil {
			v.log.Debug("save failed; its disk's copy too", "err", cerr)
		}
		if s.ram != nil {
			s.ram.Close()
		}
		_ = os.RemoveAll(s.tmp)
		if rerr := s.undo(); rerr != nil {
			v.log.Error("save failed, and the VM could not run again", "err", rerr)
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	v.log.Info("vm saved", "dir", dir, "ms", time.Since(t0).Milliseconds(), "phases", phasesString(s.meta.Phases),
		"ram_data_mib", s.meta.RAMDataBytes>>20, "overlay_mib", s.meta.OverlayBytes>>20, "keep", o.Keep, "in_memory", o.InMemory)
	sp := &SavePoint{Meta: s.meta, Dir: dir}
	if o.InMemory {
		sp.ram = s.ram
		sp.digested = make(chan struct{})
		go sp.takeDigests(v.log)
	} else {
		s.ram.Close()
	}
	return sp, nil
}

// Continue lets a VM that Save left stopped (without keep) run again, with
// a new agent connection: for a caller that could not use the save point.
func (v *VM) Continue(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	if err := v.cont(ctx); err != nil {
		return fmt.Errorf("continue: %w", err)
	}
	return v.connect(ctx)
}

// cont lets a stopped guest run again, on a monitor connection of its
// own that it closes before it returns: QEMU serves one client at a time
// on a monitor, and what follows (the agent's new connection) may need it
// (lookAtGuest, when the agent does not answer).
func (v *VM) cont(ctx context.Context) error {
	q, err := dialQMP(ctx, filepath.Join(v.Dir, QMPSocket), v.exited)
	if err != nil {
		return err
	}
	defer q.Close()
	_, err = q.run(ctx, "cont", nil)
	return err
}

// close releases the monitor.
func (s *saving) close() {
	if s.q != nil {
		s.q.Close()
	}
}

// undoLimit bounds undo: a guest agent that does not answer a new
// connection in this time (a guest root stopped it) has its VM killed.
const undoLimit = 5 * time.Second

// undo lets a VM whose save failed run again, as it ran before. A VM that
// cannot (its QEMU or its guest agent does not answer within undoLimit)
// is killed: it could not serve another command, and its owner learns
// that it is gone rather than meet a session that hangs.
func (s *saving) undo() (err error) {
	if s.v.Gone() || (!s.stopped && !s.away) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), undoLimit)
	defer cancel()
	defer func() {
		if err != nil {
			s.v.setCause(fmt.Errorf("%w: it could not run again after a failed save: %w", ErrAgentUnresponsive, err))
			_ = s.v.Kill()
			// Gone once undo returns: its caller ends what the VM held.
			select {
			case <-s.v.exited:
			case <-time.After(undoLimit):
			}
		}
	}()
	if s.noHandBack != nil {
		// An agent that did not let go of its port in handBackLimit
		// will not answer a new connection: waiting undoLimit more for
		// it would hold the caller (a pause worker) for nothing.
		return s.noHandBack
	}
	if s.stopped {
		if err := s.v.cont(ctx); err != nil {
			return fmt.Errorf("cont: %w", err)
		}
	}
	if s.away {
		return s.v.connect(ctx)
	}
	return nil
}

// hangUp closes the agent connection (VM.handBack's first half): a VM
// restored from the save point makes a connection of its own, as a clone
// of a template does. The guest agent's close and reopen, which say it
// has finished with the connection and waits for the next, are waited
// for by handOver, after the flatten, whose copy runs meanwhile
// (handback.go).
func (s *saving) hangUp(ctx context.Context) error {
	q, err := dialQMP(ctx, filepath.Join(s.v.Dir, QMPSocket), s.v.exited)
	if err != nil {
		return err
	}
	s.q = q
	s.away = true
	s.hungUp = s.v.hangUp(ctx, q)
	q.onEvent = func(r qmpReply) {
		if isHandBack(r, s.hungUp.since) {
			s.handedBack = true
		}
	}
	return nil
}

// handOver waits until the guest agent has finished with the connection
// hangUp closed and opened its port again (VM.handBack's second half).
func (s *saving) handOver(ctx context.Context) error {
	s.q.onEvent = nil
	by, err := s.v.awaitHandBack(ctx, s.q, s.hungUp, s.handedBack)
	if err != nil {
		s.noHandBack = err
		return s.v.fail("save", nil, err)
	}
	s.v.handedBackBy = by
	s.v.log.Debug("the guest agent handed its port back", "by", by, "after", time.Since(s.hungUp.since).Round(time.Microsecond))
	return nil
}

// flatten folds the layers between the VM's overlay and the image's base
// into the overlay, in the VM's QEMU (block-stream), so that its disk
// depends on the base alone.
func (s *saving) flatten(ctx context.Context) error {
	if s.v.flat {
		return nil
	}
	var done *qmpReply
	prev := s.q.onEvent
	s.q.onEvent = func(r qmpReply) {
		if r.Event == "BLOCK_JOB_COMPLETED" && done == nil {
			done = &r
		}
		if prev != nil {
			prev(r)
		}
	}
	defer func() { s.q.onEvent = prev }()
	if _, err := s.q.run(ctx, "block-stream", map[string]any{"job-id": "flatten", "device": "root", "base": s.v.img.base}); err != nil {
		return err
	}
	data := json.RawMessage(nil)
	if done != nil {
		data = done.Data
	} else if err := s.q.waitEvent(ctx, "BLOCK_JOB_COMPLETED", func(r qmpReply) bool { data = r.Data; return true }); err != nil {
		return err
	}
	if err := jobError(data); err != nil {
		return err
	}
	s.v.flat = true
	return nil
}

// jobError is the error a BLOCK_JOB_COMPLETED event reports, or nil.
func jobError(data []byte) error {
	var ev struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &ev) == nil && ev.Error != "" {
		return fmt.Errorf("block job: %s", ev.Error)
	}
	return nil
}

// stop stops the guest; QEMU flushes its disk as it does.
func (s *saving) stop(ctx context.Context) error {
	if _, err := s.q.run(ctx, "stop", nil); err != nil {
		return err
	}
	s.stopped = true
	return nil
}

// copyDisk puts the stopped VM's overlay into the save point: a second
// name of the file for a VM that is left stopped (the caller closes it),
// a copy for one that runs on. The copy is made in the background while
// the RAM is saved, and waited for before the VM runs again (copied); its
// digest is taken after it. A linked overlay's digest is taken once the
// migration is over (hashDisk): QEMU may write its metadata when it hands
// the disk over at the end.
func (s *saving) copyDisk(context.Context) error {
	src, dst := filepath.Join(s.v.Dir, OverlayFile), filepath.Join(s.tmp, OverlayFile)
	if !s.o.Keep {
		// link(2) takes a symlink as it is: its mode is set on the file,
		// which must be a regular one (openQEMUFile), and anything else
		// leaves the save point at once.
		err := os.Link(src, dst)
		if err == nil {
			if err = chmodQEMUFile(dst, 0o600); err != nil {
				_ = os.Remove(dst)
			}
			return err
		}
		if !errors.Is(err, unix.EXDEV) {
			return err
		}
	}
	s.copied = make(chan error, 1)
	s.overlay = make(chan digest, 1)
	go func() {
		err := copySparse(src, dst)
		s.copied <- err
		if err != nil {
			s.overlay <- digest{err: err}
			return
		}
		if s.o.InMemory {
			s.overlay <- digest{} // taken after the save (SavePoint.Digest)
			return
		}
		sum, mac, err := integrity.FileSums(dst, s.key, integrity.DomainOverlay)
		s.overlay <- digest{sum, mac, err}
	}()
	return nil
}

// awaitCopy waits for the disk's copy, if one is being made.
func (s *saving) awaitCopy() error {
	if s.copied == nil {
		return nil
	}
	err := <-s.copied
	s.copied = nil
	if err != nil {
		return fmt.Errorf("copy the disk: %w", err)
	}
	return nil
}

// hashDisk takes the digest of the save point's overlay in the
// background, once.
func (s *saving) hashDisk() {
	if s.overlay != nil || s.o.InMemory {
		return
	}
	s.overlay = make(chan digest, 1)
	go func() {
		sum, mac, err := integrity.FileSums(filepath.Join(s.tmp, OverlayFile), s.key, integrity.DomainOverlay)
		s.overlay <- digest{sum, mac, err}
	}()
}

// stream migrates the stopped VM into a pipe and splits the stream
// (migstream.Split) into the RAM image and the device state: with
// x-ignore-shared on, as a clone restores, so that the state loads as a
// template's, its RAM from the image.
func (s *saving) stream(ctx context.Context) error {
	size := int64(s.v.opts.MemoryMiB) << 20
	if err := s.newRAMImage(size); err != nil {
		return fmt.Errorf("RAM image: %w", err)
	}
	sf, err := os.OpenFile(filepath.Join(s.tmp, TemplateStateFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer sf.Close()
	state, err := newStateWriter(sf, s.key)
	if err != nil {
		return err
	}
	var ram io.WriterAt = s.ram
	if !s.o.InMemory {
		ram = writeBehind{s.ram}
	}
	res, err := s.split(ctx, state, ram, size)
	if err != nil {
		return err
	}
	if err := state.Flush(); err != nil {
		return cmp.Or(stateDiskFull(err, "the device state"), err)
	}
	m := &s.meta
	m.StateSHA256, m.StateMAC = state.sums()
	m.StateBytes = res.StateBytes
	if s.v.ram == nil {
		m.RAMSHA256, m.RAMMAC, m.RAMDataBytes = res.RAMDigest, res.RAMMAC, res.DataPages*integrity.PageSize
		return nil
	}
	return s.copyOwnRAM(ram)
}

// newRAMImage makes the RAM image of size bytes that the stream's RAM
// goes to: a memory file (InMemory), or a sparse file in the save point.
func (s *saving) newRAMImage(size int64) error {
	var err error
	if s.o.InMemory {
		s.ram, err = memFile("vmgate-savepoint-ram", size)
		return err
	}
	if s.ram, err = os.OpenFile(filepath.Join(s.tmp, RAMFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
		return err
	}
	return s.ram.Truncate(size)
}

// split has the stopped VM's QEMU migrate into a pipe, splits what comes
// out (migstream.Split) into state and ram (size bytes), and checks that
// the stream carried the guest's RAM unless it is a memory file of the
// VM's own, which x-ignore-shared leaves out.
func (s *saving) split(ctx context.Context, state io.Writer, ram io.WriterAt, size int64) (migstream.Result, error) {
	pr, pw, err := os.Pipe()
	if err != nil {
		return migstream.Result{}, err
	}
	defer pr.Close()
	// A bigger pipe: fewer wake-ups of either side (best effort: the
	// default is 64 KiB).
	_, _ = unix.FcntlInt(pw.Fd(), unix.F_SETPIPE_SZ, 1<<20)
	err = runCalls(ctx, s.q, []qmpCall{
		{"migrate-set-capabilities", ignoreShared, nil},
		{"migrate-set-parameters", map[string]any{"max-bandwidth": int64(64) << 30}, nil},
		{"getfd", map[string]any{"fdname": "savepoint"}, []int{int(pw.Fd())}},
	})
	pw.Close() // QEMU has its own: the stream ends when QEMU closes it
	if err != nil {
		return migstream.Result{}, err
	}
	type split struct {
		res migstream.Result
		err error
	}
	done := make(chan split, 1)
	go func() {
		res, err := migstream.Split(pr, state, ram, migstream.Options{Block: ramBlock, BlockBytes: size, MACKey: s.key})
		if err != nil {
			pr.Close() // QEMU's writes fail: the migration ends
		}
		done <- split{res, err}
	}()
	merr := s.q.runMigration(ctx, "migrate", map[string]any{"uri": "fd:savepoint"})
	var sp split
	select {
	case sp = <-done:
	case <-ctx.Done():
		pr.Close()
		sp = <-done
		if sp.err != nil {
			// The read failed because the pipe was closed here: the
			// cause is the deadline (a stop's grace), not the stream.
			return sp.res, fmt.Errorf("the migration stream was cut: %w", context.Cause(ctx))
		}
	}
	switch {
	case sp.err != nil:
		return sp.res, cmp.Or(stateDiskFull(sp.err, "the RAM image"), fmt.Errorf("split the migration stream: %w", sp.err))
	case merr != nil:
		return sp.res, merr
	case s.v.ram == nil && sp.res.DataPages == 0:
		return sp.res, errors.New("the migration stream carried none of the guest's RAM")
	case s.v.ram != nil && sp.res.DataPages+sp.res.ZeroPages != 0:
		return sp.res, errors.New("the migration stream carried the guest's RAM, which is shared")
	}
	return sp.res, nil
}

// stateWriter writes the device state to its file, buffered, and takes
// its SHA-256 and, under a save point's key, its keyed check as it goes.
type stateWriter struct {
	*bufio.Writer
	sum hash.Hash
	mac *integrity.FileMAC // nil without a key
}

func newStateWriter(f *os.File, key []byte) (*stateWriter, error) {
	w := &stateWriter{sum: sha256.New()}
	sums := io.Writer(w.sum)
	if key != nil {
		var err error
		if w.mac, err = integrity.NewFileMAC(key, integrity.DomainState); err != nil {
			return nil, err
		}
		sums = io.MultiWriter(w.sum, w.mac)
	}
	w.Writer = bufio.NewWriterSize(io.MultiWriter(f, sums), 256<<10)
	return w, nil
}

// sums are the state's SHA-256 and its keyed check ("" without a key),
// once it is flushed.
func (w *stateWriter) sums() (sum, mac string) {
	if w.mac != nil {
		mac = w.mac.Sum()
	}
	return hex.EncodeToString(w.sum.Sum(nil)), mac
}

// stateDiskFull is err as ErrStateDiskFull when it says that the state
// directory's disk is full (ENOSPC, EDQUOT) while writing what, else nil.
func stateDiskFull(err error, what string) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%w (writing %s: %v)", ErrStateDiskFull, what, err)
	}
	return nil
}

// copyOwnRAM copies the guest's RAM when it is a memory file of its own,
// which the stream left out (x-ignore-shared), while the guest is
// stopped, with its digest and keyed check taken beside the copy. A fork
// point's digest is taken after the save, while its copies are restored
// (SavePoint.Digest).
func (s *saving) copyOwnRAM(ram io.WriterAt) error {
	var sum, check *integrity.PageDigest
	var pages int64
	var err error
	if s.o.InMemory {
		pages, err = copyRAMImage(ram, s.v.ram)
	} else if check, err = integrity.NewPageCheck(s.key, false); err == nil {
		sum = integrity.NewPageDigest()
		pages, err = copyRAMImage(ram, s.v.ram, sum, check)
	}
	if err != nil {
		return cmp.Or(stateDiskFull(err, "the RAM image"), fmt.Errorf("copy the guest's RAM: %w", err))
	}
	m := &s.meta
	m.RAMDataBytes = pages * integrity.PageSize
	if sum != nil {
		m.RAMSHA256, m.RAMMAC = sum.Sum(), check.MAC()
	}
	return nil
}

// copyRAMImage copies the pages of src (a RAM image) that are not all
// zeros to dst (zeros, or a sparse file) at their offsets, adds them to
// each of ds (a digest, a keyed check) and returns their number. Each of
// ds takes them in a goroutine of its own, a few runs behind the copy: a
// resume (into a memory file) and a resumed VM's save (into a file) wait
// for all, the copy (the destination's page allocation) and SHA-256
// taking about as long (docs/benchmarks.md).
func copyRAMImage(dst io.WriterAt, src *os.File, ds ...*integrity.PageDigest) (int64, error) {
	const depth = 4 // runs in flight, of 1 MiB
	type run struct {
		off  int64
		p    []byte
		left *atomic.Int32 // of ds, those that have yet to take it
	}
	free := make(chan []byte, depth)
	for range depth {
		free <- make([]byte, 1<<20)
	}
	taken := func(r run) {
		if r.left.Add(-1) == 0 {
			free <- r.p[:cap(r.p)]
		}
	}
	fulls := make([]chan run, len(ds))
	digested := make(chan error, len(ds))
	for i, d := range ds {
		fulls[i] = make(chan run, depth)
		go func() {
			var err error
			for r := range fulls[i] {
				if err == nil {
					err = d.Add(r.off, r.p)
				}
				taken(r)
			}
			digested <- err
		}()
	}
	var pages int64
	err := readPagesInto(src, func() []byte { return <-free }, func(off int64, p []byte) error {
		n, err := writeDataPages(dst, off, p)
		pages += n
		if err != nil || len(ds) == 0 {
			free <- p[:cap(p)]
			return err
		}
		r := run{off, p, new(atomic.Int32)}
		r.left.Store(int32(len(ds)))
		for _, full := range fulls {
			full <- r
		}
		return nil
	})
	for _, full := range fulls {
		close(full)
	}
	for range ds {
		err = cmp.Or(err, <-digested)
	}
	if err != nil {
		return 0, err
	}
	return pages, nil
}

// writeDataPages writes the runs of p's pages that are not all zeros to
// dst, p being at offset off, and returns how many pages it wrote.
func writeDataPages(dst io.WriterAt, off int64, p []byte) (int64, error) {
	var pages int64
	start := -1
	for i := 0; i <= len(p); i += integrity.PageSize {
		zero := i == len(p) || integrity.IsZeroPage(p[i:i+integrity.PageSize])
		switch {
		case !zero && start < 0:
			start = i
		case zero && start >= 0:
			if _, err := dst.WriteAt(p[start:i], off+int64(start)); err != nil {
				return pages, err
			}
			pages += int64(i-start) / integrity.PageSize
			start = -1
		}
	}
	return pages, nil
}

// sync makes the state and the RAM image durable (a file), or seals the
// RAM image (a memory file); the disk's digest is taken meanwhile.
func (s *saving) sync(context.Context) error {
	if err := s.awaitCopy(); err != nil {
		return err
	}
	s.hashDisk()
	if err := durable.Sync(filepath.Join(s.tmp, TemplateStateFile)); err != nil {
		return err
	}
	if s.o.InMemory {
		return seal(s.ram)
	}
	if err := s.ram.Sync(); err != nil {
		return cmp.Or(stateDiskFull(err, "the RAM image"), err)
	}
	s.meta.RAMDataBytes = allocatedBytes(filepath.Join(s.tmp, RAMFile))
	return nil
}

// resume lets the VM run again when it is kept, with a new agent
// connection.
func (s *saving) resume(ctx context.Context) error {
	if !s.o.Keep {
		return nil
	}
	// After a completed migration QEMU has handed its disk over; cont
	// takes it back.
	if _, err := s.q.run(ctx, "cont", nil); err != nil {
		return err
	}
	s.stopped = false
	if err := s.v.connect(ctx); err != nil {
		return err
	}
	s.away = false
	return nil
}

// seal takes the disk's digest and size, writes the metadata, and makes
// the save point whole under its name. A fork point's digests and
// metadata come after the save (SavePoint.Digest).
func (s *saving) seal(context.Context) error {
	m := &s.meta
	if !s.o.InMemory {
		d := <-s.overlay
		if d.err != nil {
			return d.err
		}
		m.OverlaySHA256, m.OverlayMAC = d.sum, d.mac
	}
	m.OverlayBytes = allocatedBytes(filepath.Join(s.tmp, OverlayFile))
	if err := s.machine(); err != nil {
		return err
	}
	m.SavedAt = time.Now().UTC()
	if !s.o.InMemory {
		if err := m.write(s.tmp); err != nil {
			return err
		}
	}
	if err := durable.Sync(s.tmp); err != nil {
		return err
	}
	if err := os.Rename(s.tmp, s.dir); err != nil {
		return err
	}
	return durable.Sync(filepath.Dir(s.dir))
}

// machine records what the save point can be restored into.
func (s *saving) machine() error {
	m, err := machineOf(s.v.opts, s.v.Accel)
	if err != nil {
		return err
	}
	s.meta.Machine = m
	return nil
}
