package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/isolate"
	"github.com/vmgate/vmgate/vm/netproc"
	"github.com/vmgate/vmgate/vm/netstack"
)

// A VM comes up as a list of named steps over one launch value, as in
// firecracker-go-sdk's handler lists: a cold boot runs bootSteps, a
// restore from a template aheadSteps then completeSteps, and a clone
// launched ahead of its request (Launched) runs the two lists apart, the
// second only when a request takes it. Each step's duration is the VM's
// phase of the same name (VM.Phases). A failed step closes the VM:
// nothing of it is left.
var (
	bootSteps = []step{
		{name: "overlay", run: (*launch).overlay},
		{name: "launch", run: (*launch).startQEMU},
		{name: "agent", run: (*launch).connect},
		{name: "refresh", run: (*launch).setClock},
		{name: "disk", run: (*launch).reserveDisk},
		{name: "network", run: (*launch).network, nicOnly: true, ownLimit: true},
	}
	aheadSteps = []step{
		{name: "overlay", run: (*launch).overlay},
		{name: "launch", run: (*launch).startQEMU},
		{name: "qemu_up", run: (*launch).openIncoming},
	}
	completeSteps = []step{
		{name: "load_state", run: (*launch).loadState},
		{name: "agent", run: (*launch).connect},
		{name: "refresh", run: (*launch).reseed},
		{name: "network", run: (*launch).network, nicOnly: true, ownLimit: true},
	}
)

// step is one named step of a launch.
type step struct {
	name string
	run  func(*launch, context.Context) error
	// nicOnly: the step runs only for a VM with a NIC.
	nicOnly bool
	// ownLimit: the step bounds itself (Options.NetworkTimeout), not by
	// the boot time limit.
	ownLimit bool
}

// launch is one VM on its way up: what it is launched from and how far it
// got.
type launch struct {
	opts  Options
	img   *imageFiles
	accel Accel
	mode  launchMode
	vm    *VM
	// qmp is a restore's monitor, from qemu_up to load_state.
	qmp *qmp
	// owned are files the launch opened for QEMU (a clone's state file):
	// closed once QEMU has its copies, or when the launch fails.
	owned []*os.File
	// saved is a save point's restore (SavePoint.Restore), nil for
	// other launches.
	saved *restoring
	// filled, when set, says whether a restore's RAM was copied (while
	// QEMU starts); load_state waits for it (the fill step). verified,
	// when set, says whether the files a restore loaded are whole (checked
	// once the RAM is filled, while the guest resumes); the VM is handed
	// over only then (the verify step).
	filled, verified <-chan error
	// started is when the request's critical path began (for a clone
	// launched ahead: when Complete was called), mark the end of the last
	// step.
	started, mark time.Time
}

// ramMode says where guest RAM lives.
type ramMode int

const (
	ramAnonymous  ramMode = iota // QEMU's own memory (a cold boot)
	ramSharedFile                // the file RAMFile in the VM directory, shared (a template)
	ramPrivateFD                 // a private copy-on-write mapping of fd 4 (a clone)
	ramSharedFD                  // fd 4, a memory file of the VM's own, shared (a resumed VM: VM.ram)
)

// RAMFile is a template VM's guest RAM in its directory.
const RAMFile = "ram"

// KernelStubFile is the kernel a restored VM's QEMU is given, in its
// directory (imageFiles.kernelStub).
const KernelStubFile = "kernel.stub"

// launchMode is what differs between a cold boot, a template and a clone.
type launchMode struct {
	backing  string     // the overlay's backing file
	readOnly []string   // files and directories the jail shows read-only
	ram      ramMode    // where guest RAM lives
	files    []*os.File // passed to QEMU as fds 4, 5, …
	// restore: QEMU starts with -incoming defer and loads the migration
	// stream (load_state) from fd 5, the state file after the RAM's fd,
	// with x-ignore-shared.
	restore bool
	// untrustedBacking: the backing file was written by a VM's QEMU (a
	// save point's disk); the host's qemu-img never opens it.
	untrustedBacking bool
}

// newLaunch is the launch of a new VM of opts from the image img, under
// accel, as m says.
func newLaunch(opts Options, img *imageFiles, accel Accel, m launchMode) *launch {
	l := launchOf(opts)
	l.setImage(img, accel)
	l.setMode(m)
	return l
}

// launchOf is the launch of a new VM of opts, whose image, accelerator
// and mode its first steps set (a save point's restore: validate, open).
func launchOf(opts Options) *launch {
	id := newID()
	now := time.Now()
	return &launch{opts: opts, started: now, mark: now,
		vm: &VM{ID: id, log: opts.Log.With("vm", id), exited: make(chan struct{}), opts: opts}}
}

// setImage sets the image the VM is launched from, and its accelerator.
func (l *launch) setImage(img *imageFiles, accel Accel) {
	l.img, l.accel = img, accel
	l.vm.img, l.vm.Accel = img, accel
}

// setMode sets how the VM is launched (after setImage).
func (l *launch) setMode(m launchMode) {
	l.mode = m
	l.vm.flat = m.backing == l.img.base && l.img.base != ""
}

// Start boots a fresh VM on a new overlay of the image and waits until its
// agent answers.
//
// Postcondition: on error nothing of the VM is left (no process, no files).
func Start(ctx context.Context, opts Options) (*VM, error) {
	opts.setDefaults()
	img, accel, err := prepare(ctx, opts)
	if err != nil {
		return nil, err
	}
	l := newLaunch(opts, img, accel, launchMode{backing: img.base, readOnly: img.qemuFiles()})
	return l.finish(ctx, bootSteps)
}

// prepare loads the image and resolves the accelerator.
func prepare(ctx context.Context, opts Options) (*imageFiles, Accel, error) {
	img, err := loadImage(opts.ImageDir)
	if err != nil {
		return nil, "", err
	}
	accel, err := ResolveAccel(ctx, opts.Accel, opts.QEMU, img.kernel, img.initrd, opts.StateDir, opts.Log)
	if err != nil {
		return nil, "", err
	}
	return img, accel, nil
}

// run runs steps in order, each under the boot time limit unless it has
// its own, and records their phases.
func (l *launch) run(ctx context.Context, steps []step) error {
	bootCtx, cancel := context.WithTimeout(ctx, l.opts.BootTimeout)
	defer cancel()
	for _, s := range steps {
		if s.nicOnly && l.opts.Network == nil {
			continue
		}
		sctx := bootCtx
		if s.ownLimit {
			sctx = ctx
		}
		if err := s.run(l, sctx); err != nil {
			return err
		}
		now := time.Now()
		l.vm.phases = append(l.vm.phases, Phase{s.name, now.Sub(l.mark)})
		l.mark = now
	}
	return nil
}

// release closes the files the launch opened for QEMU.
func (l *launch) release() {
	for _, f := range l.owned {
		_ = f.Close()
	}
	l.owned = nil
}

// abort closes the VM of a launch that failed.
func (l *launch) abort() {
	l.release()
	if l.qmp != nil {
		_ = l.qmp.Close()
		l.qmp = nil
	}
	if err := l.vm.Close(); err != nil {
		l.vm.log.Warn("cleanup after failed start", "err", err)
	}
}

// finish runs the last steps of a launch, up to a VM that runs commands,
// and logs it; on error the VM is closed.
func (l *launch) finish(ctx context.Context, steps []step) (*VM, error) {
	if err := l.run(ctx, steps); err != nil {
		l.abort()
		return nil, err
	}
	v := l.vm
	v.bootTime = time.Since(l.started)
	kind := "boot_ms"
	if l.mode.restore {
		kind = "restore_ms"
	}
	if rep, err := v.JailReport(); err == nil {
		v.log.Info("vm ready", "accel", v.Accel, kind, v.bootTime.Milliseconds(), "phases", phasesString(v.phases), "jail", rep.String())
	} else {
		v.log.Warn("vm ready, jail report unavailable", "accel", v.Accel, kind, v.bootTime.Milliseconds(), "err", err)
	}
	return v, nil
}

// overlay creates the VM's private directory (removed by Close) and its
// overlay on the mode's backing file.
func (l *launch) overlay(ctx context.Context) error {
	v := l.vm
	vmsDir := filepath.Join(l.opts.StateDir, "vms")
	if err := os.MkdirAll(vmsDir, 0o700); err != nil {
		return fmt.Errorf("start vm: %w", err)
	}
	dir, err := filepath.Abs(filepath.Join(vmsDir, v.ID))
	if err != nil {
		return fmt.Errorf("start vm: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("start vm: %w", err)
	}
	v.Dir = dir
	v.push(func() error { return os.RemoveAll(v.Dir) })
	size := 0
	if l.mode.untrustedBacking {
		size = l.img.diskMiB
	}
	return createOverlayOf(ctx, l.mode.backing, filepath.Join(v.Dir, OverlayFile), size)
}

// startQEMU builds the command line, the network and the cgroup, and
// starts QEMU in its jail.
func (l *launch) startQEMU(context.Context) error {
	v, opts, m := l.vm, l.opts, l.mode
	spec := LaunchSpec{
		QEMU: opts.QEMU, Dir: v.Dir, Kernel: l.img.kernel, Initrd: l.img.initrd,
		MemoryMiB: opts.MemoryMiB, CPUs: opts.CPUs, Accel: l.accel, TSCkHz: HostTSCkHz(), TCGTBSizeMiB: opts.TCGTBSizeMiB,
		NoRandMaps: opts.noRandMaps(l.accel),
		Incoming:   m.restore, Network: opts.Network != nil,
		// The jail passes its spec pipe as fd 3, then m.files, then the
		// console pipe.
		ConsoleFD: 4 + len(m.files),
	}
	if stub := l.img.kernelStub(); m.restore && stub != nil {
		// A restored guest is never booted: its QEMU gets the kernel's
		// header only (imageFiles.kernelStub).
		spec.Kernel = filepath.Join(v.Dir, KernelStubFile)
		if err := os.WriteFile(spec.Kernel, stub, 0o600); err != nil {
			return fmt.Errorf("start vm: %w", err)
		}
	}
	switch m.ram {
	case ramSharedFile:
		spec.RAMPath, spec.RAMShared = filepath.Join(v.Dir, RAMFile), true
	case ramPrivateFD:
		spec.RAMPath = "/proc/self/fd/4"
	case ramSharedFD:
		spec.RAMPath, spec.RAMShared = "/proc/self/fd/4", true
	}
	argv, err := spec.Cmdline()
	if err != nil {
		return err
	}
	if opts.Network != nil {
		if err := l.startNetwork(*opts.Network); err != nil {
			return err
		}
	}
	c, cw, err := startConsole(v.Dir)
	if err != nil {
		return fmt.Errorf("start vm: %w", err)
	}
	defer cw.Close() // QEMU has its own copy once started
	v.console = c
	// Pushed before QEMU's kill, so it runs after QEMU has exited (and
	// closed the pipe); if QEMU never starts, closing cw ends it.
	v.push(func() error { c.wait(); return nil })
	j, err := jailedCommand(argv, jailOpts{vmDir: v.Dir, readOnly: m.readOnly, accel: l.accel, memMiB: opts.MemoryMiB, overlay: l.diskBound(), ramFile: m.ram == ramSharedFile,
		seccomp: opts.Seccomp, incoming: m.restore, network: spec.Network}, append(m.files, cw)...)
	if err != nil {
		return err
	}
	if opts.Seccomp == "off" {
		v.log.Warn("SECCOMP WARNING: the jail's seccomp filter is off by configuration")
	}
	if opts.Cgroups != nil {
		g, err := opts.Cgroups.New(v.ID, JailLimits(opts.MemoryMiB, opts.CPUs))
		if err != nil {
			return fmt.Errorf("start vm: %w", err)
		}
		// Pushed before QEMU's kill, so it runs after QEMU has exited.
		v.push(g.Remove)
		v.cgroup = g
		if opts.Background {
			if err := g.SetCPUWeight(backgroundWeight); err != nil {
				v.log.Warn("background CPU weight", "err", err)
			}
		}
	}
	err = v.launchJail(j, argv)
	l.release() // QEMU has its own copies now
	return err
}

// launchJail starts QEMU's jail and the goroutines that wait for its exit
// and watch its events; QEMU's kill goes on the cleanup stack.
func (v *VM) launchJail(j *isolate.Jail, argv []string) error {
	cmd := j.Cmd
	logf, err := os.OpenFile(filepath.Join(v.Dir, QEMULog), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = v.Dir
	// The jail's command dies with the daemon (Pdeathsig): a crash leaves
	// at most files, which CleanupStale removes on the next start.
	if err := j.Start(v.cgroup); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	v.cmd = cmd
	_ = os.WriteFile(filepath.Join(v.Dir, PidFile), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600)
	go func() {
		v.exitErr = cmd.Wait()
		close(v.exited)
	}()
	v.push(func() error {
		select {
		case <-v.exited:
			return nil
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-v.exited:
			return nil
		case <-time.After(killWait):
			return fmt.Errorf("qemu pid %d did not exit after SIGKILL", cmd.Process.Pid)
		}
	})
	go v.watchEvents()
	v.log.Debug("qemu started", "pid", cmd.Process.Pid, "argv", strings.Join(argv, " "))
	return nil
}

// startNetwork starts the VM's user-space network, listening on its
// socket; QEMU connects when it starts. It runs in a jailed netstack
// process (package vm/netproc), except for a Config with Resolve or Dial
// set: functions cannot cross into another process, so that test
// plumbing (a fake Internet) runs the network in this process.
func (l *launch) startNetwork(cfg netstack.Config) error {
	v := l.vm
	if cfg.Log == nil {
		cfg.Log = v.log
	}
	if cfg.Resolve != nil || cfg.Dial != nil {
		v.log.Warn("RELAXATION: the guest network runs in this process (a Resolve or Dial function is set)")
		return v.startNetworkHere(cfg)
	}
	var spec isolate.Spec
	if l.opts.NetstackSocket == "" {
		var err error
		if spec, err = NetstackSpec(l.opts.Seccomp); err != nil {
			return fmt.Errorf("start vm: %w", err)
		}
	}
	ln, err := net.Listen("unix", filepath.Join(v.Dir, NetSocket))
	if err != nil {
		return fmt.Errorf("start vm: network socket: %w", err)
	}
	ul := ln.(*net.UnixListener)
	ul.SetUnlinkOnClose(false) // the socket file is QEMU's to connect to
	lf, err := ul.File()
	ln.Close() // the netstack has its own copy
	if err != nil {
		return fmt.Errorf("start vm: network socket: %w", err)
	}
	defer lf.Close()
	p, err := netproc.Start(netproc.Config{Jail: spec, Socket: l.opts.NetstackSocket, Roots: l.opts.SecretRoots, Hosts: cfg.Hosts, Policy: cfg.Policy, Log: cfg.Log.With("vm", v.ID)}, lf)
	if err != nil {
		return fmt.Errorf("start vm: %w", err)
	}
	v.net = p
	v.push(func() error { p.Close(); return nil })
	return nil
}

// startNetworkHere runs the VM's network in this process.
func (v *VM) startNetworkHere(cfg netstack.Config) error {
	n, err := netstack.New(cfg)
	if err != nil {
		return fmt.Errorf("start vm: %w", err)
	}
	ln, err := net.Listen("unix", filepath.Join(v.Dir, NetSocket))
	if err != nil {
		n.Close()
		return fmt.Errorf("start vm: network socket: %w", err)
	}
	v.net = n
	served := make(chan struct{})
	go func() {
		defer close(served)
		c, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		if err := n.Serve(c); err != nil {
			v.log.Debug("network ended", "err", err)
		}
	}()
	v.push(func() error {
		ln.Close()
		n.Close()
		<-served
		return nil
	})
	return nil
}

// openIncoming connects to a restore's QEMU, waiting until it is up (its
// QMP socket answers), and sets the migration capabilities; the
// connection is kept for load_state.
func (l *launch) openIncoming(ctx context.Context) error {
	q, err := dialQMP(ctx, filepath.Join(l.vm.Dir, QMPSocket), l.vm.exited)
	if err != nil {
		return l.vm.failedRestore(err)
	}
	if _, err := q.run(ctx, "migrate-set-capabilities", ignoreShared); err != nil {
		q.Close()
		return l.vm.failedRestore(err)
	}
	l.qmp = q
	return nil
}

// fill waits for a restore's RAM to be copied (a save point's), begun
// before QEMU started.
func (l *launch) fill(ctx context.Context) error {
	return wait(ctx, l.filled, "copying the saved RAM")
}

// verify waits for the check of the files a restore loaded (a save
// point's), begun once its RAM was copied.
func (l *launch) verify(ctx context.Context) error {
	return wait(ctx, l.verified, "checking the saved files")
}

// wait waits for the result on ch of what a restore does beside its
// steps, if ch is set.
func wait(ctx context.Context, ch <-chan error, what string) error {
	if ch == nil {
		return nil
	}
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("restore: %s: %w", what, context.Cause(ctx))
	}
}

// loadState feeds the migration stream on QEMU's fd 5 into the waiting
// QEMU and lets the guest run.
func (l *launch) loadState(ctx context.Context) error {
	q, v := l.qmp, l.vm
	if q == nil {
		return errors.New("restore: QEMU's monitor is not connected")
	}
	l.qmp = nil
	defer q.Close()
	if err := q.runMigration(ctx, "migrate-incoming", map[string]any{"uri": "fd:5"}); err != nil {
		return v.failedRestore(err)
	}
	// QEMU sets the run state the migration brought (paused, for a
	// state saved stopped) just after the end's event; a cont before
	// that would be overruled by it.
	for {
		st, err := q.status(ctx)
		if err != nil {
			return v.failedRestore(err)
		}
		if st == "paused" || st == "prelaunch" || st == "running" {
			break
		}
		if st != "inmigrate" {
			return v.failedRestore(fmt.Errorf("unexpected state %q", st))
		}
		select {
		case <-ctx.Done():
			return v.failedRestore(ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	if _, err := q.run(ctx, "cont", nil); err != nil {
		return v.failedRestore(err)
	}
	return nil
}

// failedRestore is the error of a restore step: a QEMU that exited says
// why (QEMU exits when it cannot load the stream; isDead gives it a
// moment), else the step's error.
func (v *VM) failedRestore(err error) error {
	if v.isDead() {
		return v.died("during restore")
	}
	return v.fail("restore", nil, err)
}

// connect dials the agent socket and waits for the agent's answer to the
// host's hello.
func (l *launch) connect(ctx context.Context) error { return l.vm.connect(ctx) }

// connect dials the agent socket and waits for the agent's answer to the
// host's hello, which comes only once the guest agent runs (the readiness
// signal), and makes it the VM's agent connection. A failed hello is a
// failed VM: the channel carries nothing but this one connection's bytes
// (a clone's agent waits on a freshly opened port), so there is nothing a
// reconnect could skip.
func (v *VM) connect(ctx context.Context) error {
	path := filepath.Join(v.Dir, AgentSocket)
	var conn net.Conn
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			conn = c
			break
		}
		select {
		case <-v.exited:
			return v.died("during boot")
		case <-ctx.Done():
			return fmt.Errorf("vm %s: boot: agent socket never appeared: %w", v.ID, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	c := agentconn.Client(conn, v.log)
	done := make(chan error, 1)
	go func() {
		_, err := c.Hello(ctx)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-v.exited:
		_ = c.Close()
		<-done
		return v.died("during boot")
	}
	switch {
	case err == nil:
		v.attach(c)
		return nil
	case v.isDead():
		// QEMU's exit ends the connection first: a VM that died says
		// why, and is not a failed hello.
		_ = c.Close()
		return v.died("during boot")
	case ctx.Err() != nil:
		g := v.lookAtGuest(ctx) // before the host hangs up, which it reports
		_ = c.Close()
		e := v.fail("boot", nil, fmt.Errorf("guest agent did not answer in time (%w)", ctx.Err()))
		e.Guest = g.String()
		return e
	case errors.Is(err, agentproto.ErrSSHAgent):
		return fmt.Errorf("vm %s: %w: %w; rebuild the image (vmgated image build --force)", v.ID, ErrHandshake, err)
	}
	return fmt.Errorf("vm %s: %w: %w", v.ID, ErrHandshake, err)
}

// setClock sets a cold-booted guest's clock from the host; a failure is
// logged, not fatal (the guest's own clock is close).
func (l *launch) setClock(ctx context.Context) error {
	if err := l.vm.refresh(ctx, false); err != nil {
		l.vm.log.Warn("set guest clock", "err", err)
	}
	return nil
}

// reseed refreshes a clone's clock and entropy: it wakes with its
// template's, and is never handed out with them.
func (l *launch) reseed(ctx context.Context) error {
	return l.vm.refresh(ctx, true)
}

// network waits, once the agent answers, for a VM with a NIC to have a
// usable network: the agent answers before the guest's network is up (a
// cold boot's DHCP comes seconds later), and a command must not start
// without it.
func (l *launch) network(ctx context.Context) error {
	if _, err := l.vm.waitNetwork(ctx, l.opts.NetworkTimeout); err != nil {
		return fmt.Errorf("vm %s: %w", l.vm.ID, err)
	}
	return nil
}

// Launched is a clone launched ahead of its request (Template.Prestart):
// a new overlay, QEMU up in its jail with the template's RAM, waiting for
// its state; no guest code has run. Complete makes it a VM, at most once:
// it takes the launch out of the value. Close gives it up.
type Launched struct {
	tmpl *Template
	id   string

	mu sync.Mutex
	l  *launch // nil once completed or closed
}

// ID is the id of the VM the clone becomes.
func (a *Launched) ID() string { return a.id }

// Pid is the clone's QEMU process id (0 once it is taken).
func (a *Launched) Pid() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.l == nil {
		return 0
	}
	return a.l.vm.Pid()
}

// take removes the launch from a, once.
func (a *Launched) take() *launch {
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.l
	a.l = nil
	return l
}

// Gone reports whether the clone's QEMU exited while it waited (or it was
// taken).
func (a *Launched) Gone() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.l == nil || a.l.vm.Gone()
}

// Died describes why a clone whose QEMU exited while it waited is gone.
func (a *Launched) Died() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.l == nil {
		return ErrClosed
	}
	return a.l.vm.died("while launched ahead")
}

// Foreground gives the clone the normal CPU weight (it was launched at the
// lowest, as a pool's stock).
func (a *Launched) Foreground() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.l == nil {
		return ErrClosed
	}
	return a.l.vm.Foreground()
}

// Complete loads the clone's state and connects its agent, refreshes its
// clock and entropy, and returns the VM, timed from here (the request's
// critical path). A clone whose QEMU exited while it waited is never
// used; when the completion fails the clone is closed.
func (a *Launched) Complete(ctx context.Context) (*VM, error) {
	l := a.take()
	if l == nil {
		return nil, errors.New("restore: a clone launched ahead is completed once")
	}
	l.started, l.mark, l.vm.phases = time.Now(), time.Now(), nil
	var v *VM
	var err error
	if l.vm.Gone() {
		err = l.vm.died("while launched ahead")
		l.abort()
	} else {
		v, err = l.finish(ctx, completeSteps)
	}
	if errors.Is(err, ErrHandshake) {
		a.tmpl.handshakeFailures.Add(1)
	}
	return v, err
}

// Close gives the clone up: its QEMU is killed and its files removed. It
// does nothing after Complete.
func (a *Launched) Close() error {
	l := a.take()
	if l == nil {
		return nil
	}
	l.release()
	if l.qmp != nil {
		_ = l.qmp.Close()
		l.qmp = nil
	}
	return l.vm.Close()
}
