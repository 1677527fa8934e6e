package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Saving a VM into a save point is a list of named steps over one value,
// as a launch is: each step's time is a phase of the save point
// (SavePointMeta.Phases).
var saveSteps = []saveStep{
	{"hand_over", (*saving).handOver},
	{"flatten", (*saving).flatten},
	{"stop", (*saving).stop},
	{"disk", (*saving).copyDisk},
	{"recorder", (*saving).startRecorder},
	{"migrate", (*saving).migrate},
	{"resume", (*saving).resume},
	{"state", (*saving).saveState},
	{"seal", (*saving).seal},
}

type saveStep struct {
	name string
	run  func(*saving, context.Context) error
}

// saving is one save of a running VM.
type saving struct {
	v    *VM
	dir  string // the save point's directory, once whole
	tmp  string // where it is written
	keep bool

	q       *qmp // the VM's monitor
	stopped bool // the guest is stopped (and runs again on failure)
	away    bool // the agent connection was handed back
	rec     *VM  // the recorder
	recQ    *qmp
	recQuit bool     // the recorder was told to quit: its exit is no failure
	out     *os.File // the VM's end of the socket pair to the recorder
	meta    SavePointMeta
	overlay chan digest // the disk's digest, taken while the recorder runs
}

type digest struct {
	sum string
	err error
}

// saveTimeout bounds a save: QEMU's start, a migration of the guest's
// RAM through a socket, a copy of its disk.
const saveTimeout = 2 * time.Minute

// Save writes the running VM to a new save point in dir (which must not
// exist; its parent must). Its guest is stopped for the time of it and
// runs again afterwards when keep; otherwise it is left stopped, for the
// caller to close. The VM must be idle: no command runs in it.
//
// How: the agent's connection is handed back, so that the guest agent
// waits for a new host on a reopened port, as in a template; the VM's
// disk is flattened onto the image's base (block-stream: a template's or
// save point's disk folded in, so that the save point needs nothing but
// the image); the guest stops and its overlay is copied; a recorder QEMU,
// jailed like any VM and never running its guest, takes the VM's state by
// migration with its RAM in a file, and writes the device state without
// RAM, as a template build does.
//
// Postcondition: on error nothing of the save point is left, and a VM
// that ran runs again (with a new agent connection).
func (v *VM) Save(ctx context.Context, dir string, keep bool) (*SavePoint, error) {
	ctx, cancel := context.WithTimeout(ctx, saveTimeout)
	defer cancel()
	s := &saving{v: v, dir: dir, tmp: dir + ".partial", keep: keep}
	if err := os.Mkdir(s.tmp, 0o700); err != nil {
		return nil, fmt.Errorf("save: %w", err)
	}
	s.meta = SavePointMeta{Format: savePointFormat, MemoryMiB: v.opts.MemoryMiB, CPUs: v.opts.CPUs, Accel: v.Accel, Network: v.opts.Network != nil, Launch: templateFormat}
	t0 := time.Now()
	mark := t0
	var err error
	for _, st := range saveSteps {
		if err = st.run(s, ctx); err != nil {
			err = fmt.Errorf("save %s: %w", st.name, s.explain(ctx, err))
			break
		}
		now := time.Now()
		s.meta.Phases = append(s.meta.Phases, Phase{st.name, now.Sub(mark)})
		mark = now
	}
	s.close()
	if err != nil {
		_ = os.RemoveAll(s.tmp)
		if rerr := s.undo(); rerr != nil {
			v.log.Error("save failed, and the VM could not run again", "err", rerr)
			err = errors.Join(err, rerr)
		}
		return nil, err
	}
	v.log.Info("vm saved", "dir", dir, "ms", time.Since(t0).Milliseconds(), "phases", phasesString(s.meta.Phases),
		"ram_data_mib", s.meta.RAMDataBytes>>20, "overlay_mib", s.meta.OverlayBytes>>20, "keep", keep)
	return &SavePoint{Meta: s.meta, Dir: dir}, nil
}

// Continue lets a VM that Save left stopped (without keep) run again, with
// a new agent connection: for a caller that could not use the save point.
func (v *VM) Continue(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	q, err := dialQMP(ctx, filepath.Join(v.Dir, QMPSocket), v.exited)
	if err != nil {
		return fmt.Errorf("continue: %w", err)
	}
	defer q.Close()
	if _, err := q.run(ctx, "cont", nil); err != nil {
		return fmt.Errorf("continue: %w", err)
	}
	return v.connect(ctx)
}

// recorderExitWait bounds how long a failed step waits for the recorder's
// exit, to tell whether the recorder's death was its cause: a recorder
// that dies closes its end of the migration before it is reaped.
const recorderExitWait = 2 * time.Second

// explain gives a failed step the recorder's death as its cause when the
// recorder died: the VM's side of the migration sees only a broken pipe.
// A recorder whose RAM file could not grow (the state directory's disk is
// full) died of SIGBUS, which its death says (ErrStateDiskFull).
// Precondition: the recorder is not closed yet.
func (s *saving) explain(ctx context.Context, err error) error {
	if s.rec == nil || s.recQuit || ctx.Err() != nil {
		return err
	}
	select {
	case <-s.rec.exited:
	case <-time.After(recorderExitWait):
		return err
	}
	return fmt.Errorf("recorder: %w (%v)", s.rec.died("while taking the VM's state"), err)
}

// close releases the monitors and the recorder.
func (s *saving) close() {
	if s.out != nil {
		s.out.Close()
	}
	if s.recQ != nil {
		s.recQ.Close()
	}
	if s.rec != nil {
		if err := s.rec.Close(); err != nil {
			s.v.log.Warn("close the recorder", "err", err)
		}
	}
	if s.q != nil {
		s.q.Close()
	}
}

// undo lets a VM whose save failed run again, as it ran before.
func (s *saving) undo() error {
	if s.v.Gone() || (!s.stopped && !s.away) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), controlTimeout)
	defer cancel()
	if s.stopped {
		q, err := dialQMP(ctx, filepath.Join(s.v.Dir, QMPSocket), s.v.exited)
		if err != nil {
			return fmt.Errorf("cont: %w", err)
		}
		defer q.Close()
		if _, err := q.run(ctx, "cont", nil); err != nil {
			return fmt.Errorf("cont: %w", err)
		}
	}
	if s.away {
		return s.v.connect(ctx)
	}
	return nil
}

// handOver closes the agent connection and waits until the guest agent
// has finished with it (VM.handBack): a VM restored from the save point
// makes a connection of its own, as a clone of a template does.
func (s *saving) handOver(ctx context.Context) error {
	q, err := dialQMP(ctx, filepath.Join(s.v.Dir, QMPSocket), s.v.exited)
	if err != nil {
		return err
	}
	s.q = q
	s.away = true
	if err := s.v.handBack(ctx, q); err != nil {
		return s.v.fail("save", nil, err)
	}
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
	s.q.onEvent = func(r qmpReply) {
		if r.Event == "BLOCK_JOB_COMPLETED" && done == nil {
			done = &r
		}
	}
	defer func() { s.q.onEvent = nil }()
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

// copyDisk copies the stopped VM's overlay into the save point, and takes
// its digest meanwhile.
func (s *saving) copyDisk(context.Context) error {
	dst := filepath.Join(s.tmp, OverlayFile)
	if err := copySparse(filepath.Join(s.v.Dir, OverlayFile), dst); err != nil {
		return err
	}
	s.overlay = make(chan digest, 1)
	go func() {
		sum, err := fileSHA256(dst)
		s.overlay <- digest{sum, err}
	}()
	return nil
}

// startRecorder starts the recorder, with the VM's shape and devices, its
// RAM in a file it shares with the host, its disk a throwaway overlay on
// the save point's, waiting for the VM's state on one end of a socket
// pair.
func (s *saving) startRecorder(ctx context.Context) error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socketpair: %w", err)
	}
	theirs := os.NewFile(uintptr(fds[0]), "recorder-in")
	s.out = os.NewFile(uintptr(fds[1]), "recorder-out")
	opts := s.v.opts
	opts.Background, opts.BootTimeout = false, saveTimeout
	m := launchMode{backing: filepath.Join(s.tmp, OverlayFile), untrustedBacking: true, readOnly: append(s.v.img.qemuFiles(), s.tmp),
		ram: ramSharedFile, files: []*os.File{theirs}, restore: true, incoming: "fd:4", fullStream: true, netDummy: true}
	l := newLaunch(opts, s.v.img, s.v.Accel, m)
	l.owned = append(l.owned, theirs)
	if err := l.run(ctx, aheadSteps); err != nil {
		l.abort()
		return fmt.Errorf("recorder: %w", err)
	}
	s.rec, s.recQ, l.qmp = l.vm, l.qmp, nil
	// No state can arrive before migrate sends it: the recorder's end of
	// the migration is awaited there.
	for _, cmd := range []struct {
		name string
		args any
	}{{"migrate-set-capabilities", migrationEvents}, {"migrate-incoming", map[string]any{"uri": "fd:4"}}} {
		if _, err := s.recQ.run(ctx, cmd.name, cmd.args); err != nil {
			return fmt.Errorf("recorder: %w", err)
		}
	}
	return nil
}

// migrate migrates the stopped VM into the recorder.
func (s *saving) migrate(ctx context.Context) error {
	ours := s.out
	// The VM's migration capabilities are those of its own restore (a
	// clone's x-ignore-shared): this stream carries its RAM.
	steps := []struct {
		cmd  string
		args any
		fds  []int
	}{
		{"migrate-set-capabilities", map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": false}}}, nil},
		{"migrate-set-parameters", map[string]any{"max-bandwidth": int64(64) << 30}, nil},
		{"getfd", map[string]any{"fdname": "recorder"}, []int{int(ours.Fd())}},
	}
	for _, st := range steps {
		if _, err := s.q.run(ctx, st.cmd, st.args, st.fds...); err != nil {
			return err
		}
	}
	if err := s.q.runMigration(ctx, "migrate", map[string]any{"uri": "fd:recorder"}); err != nil {
		return err
	}
	if err := s.recQ.awaitMigration(ctx); err != nil {
		return fmt.Errorf("recorder: %w", err)
	}
	// The stopped VM's state arrives stopped: the recorder never runs its
	// guest. QEMU sets the run state just after the end's event.
	st, err := s.recQ.status(ctx)
	for err == nil && st == "inmigrate" {
		select {
		case <-ctx.Done():
			return fmt.Errorf("recorder: %w", ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
		st, err = s.recQ.status(ctx)
	}
	if err != nil {
		return fmt.Errorf("recorder: %w", err)
	}
	if st != "paused" {
		return fmt.Errorf("recorder: in state %q after the migration, want paused", st)
	}
	return nil
}

// resume lets the VM run again when it is kept, with a new agent
// connection.
func (s *saving) resume(ctx context.Context) error {
	if !s.keep {
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

// saveState has the recorder write the device state without RAM into the
// save point, quit, and hand its RAM file over.
func (s *saving) saveState(ctx context.Context) error {
	sf, err := os.OpenFile(filepath.Join(s.tmp, TemplateStateFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer sf.Close()
	steps := []struct {
		cmd  string
		args any
		fds  []int
	}{
		{"migrate-set-capabilities", ignoreShared, nil},
		{"getfd", map[string]any{"fdname": "state"}, []int{int(sf.Fd())}},
	}
	for _, st := range steps {
		if _, err := s.recQ.run(ctx, st.cmd, st.args, st.fds...); err != nil {
			return fmt.Errorf("recorder: %w", err)
		}
	}
	if err := s.recQ.runMigration(ctx, "migrate", map[string]any{"uri": "fd:state"}); err != nil {
		return fmt.Errorf("recorder: %w", err)
	}
	if err := sf.Sync(); err != nil {
		return err
	}
	s.recQuit = true
	_, _ = s.recQ.run(ctx, "quit", nil)
	select {
	case <-s.rec.exited:
	case <-time.After(killWait):
		_ = s.rec.Kill()
		<-s.rec.exited
	}
	ram := filepath.Join(s.tmp, RAMFile)
	if err := os.Rename(filepath.Join(s.rec.Dir, RAMFile), ram); err != nil {
		return err
	}
	f, err := os.Open(ram)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Chmod(0o600)
}

// seal takes the files' digests and sizes, writes the metadata, and makes
// the save point whole under its name.
func (s *saving) seal(context.Context) error {
	m := &s.meta
	d := <-s.overlay
	if d.err != nil {
		return d.err
	}
	m.OverlaySHA256 = d.sum
	var err error
	if m.StateSHA256, err = fileSHA256(filepath.Join(s.tmp, TemplateStateFile)); err != nil {
		return err
	}
	ram, err := os.Open(filepath.Join(s.tmp, RAMFile))
	if err != nil {
		return err
	}
	m.RAMSHA256, err = extentSHA256(ram)
	ram.Close()
	if err != nil {
		return err
	}
	m.OverlayBytes = allocatedBytes(filepath.Join(s.tmp, OverlayFile))
	m.RAMDataBytes = allocatedBytes(filepath.Join(s.tmp, RAMFile))
	if st, err := os.Stat(filepath.Join(s.tmp, TemplateStateFile)); err == nil {
		m.StateBytes = st.Size()
	}
	if err := s.machine(); err != nil {
		return err
	}
	m.SavedAt = time.Now().UTC()
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := writeFileSync(filepath.Join(s.tmp, SavePointMetaFile), append(b, '\n')); err != nil {
		return err
	}
	if err := os.Rename(s.tmp, s.dir); err != nil {
		return err
	}
	return syncDir(filepath.Dir(s.dir))
}

// machine records what the save point can be restored into.
func (s *saving) machine() error {
	want, err := wantTemplate(s.v.opts, s.v.Accel)
	if err != nil {
		return err
	}
	m := &s.meta
	m.ImageDigest, m.KernelDigest, m.InitrdDigest, m.QEMUVersion = want.ImageDigest, want.KernelDigest, want.InitrdDigest, want.QEMUVersion
	return nil
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
