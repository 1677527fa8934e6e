package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/isolate"
	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/vm/guest/agentconn"
	"github.com/vmgate/vmgate/vm/guest/agentproto"
	"github.com/vmgate/vmgate/vm/image"
	"github.com/vmgate/vmgate/vm/netproc"
	"github.com/vmgate/vmgate/vm/netstack"
)

// ErrVMDied reports that QEMU exited while the VM was in use.
var ErrVMDied = errors.New("vm died")

// ErrClosed reports use of a VM after Close.
var ErrClosed = errors.New("vm closed")

// Options configure Start.
type Options struct {
	// ImageDir holds a built image (see package image). Required.
	ImageDir string
	// StateDir is where VM directories are created (StateDir/vms/ID). Required.
	StateDir string
	// MemoryMiB defaults to 512, CPUs to 1.
	MemoryMiB int
	CPUs      int
	// Accel: auto (default), kvm or tcg.
	Accel Accel
	// TCGTBSizeMiB sizes TCG's translation buffer; 0 is QEMU's default
	// (docs/benchmarks.md has what it costs and saves).
	TCGTBSizeMiB int
	// QEMU binary; default qemu-system-x86_64 from PATH.
	QEMU string
	// BootTimeout bounds boot until the agent answers; default 180s.
	BootTimeout time.Duration
	// Log defaults to slog.Default().
	Log *slog.Logger
	// Seccomp is the jail's filter mode: "required" (default) or "off"
	// (a logged relaxation). QEMU always runs in the jail (package isolate).
	Seccomp string
	// Cgroups, when set, puts each VM's jail in its own cgroup with
	// JailLimits; nil leaves QEMU bounded by rlimits only (the daemon logs
	// that as a relaxation).
	Cgroups *cgroup.Manager
	// TemplateDir holds VM templates (default StateDir/templates).
	TemplateDir string
	// Network, when set, gives the VM a NIC on its own user-space network
	// (package netstack) with this policy; nil: no NIC at all. The
	// policy can be replaced later (VM.Network().SetPolicy), as the pool
	// does when it hands a VM out.
	Network *netstack.Config
	// NetstackSocket: see HostConfig.NetstackSocket.
	NetstackSocket string
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

func (o *Options) setDefaults() {
	if o.MemoryMiB == 0 {
		o.MemoryMiB = DefaultMemoryMiB
	}
	if o.CPUs == 0 {
		o.CPUs = DefaultCPUs
	}
	if o.Accel == "" {
		o.Accel = AccelAuto
	}
	if o.QEMU == "" {
		o.QEMU = "qemu-system-x86_64"
	}
	if o.BootTimeout == 0 {
		o.BootTimeout = 180 * time.Second
	}
	if o.NetworkTimeout == 0 {
		o.NetworkTimeout = DefaultNetworkTimeout
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// VM is one running disposable virtual machine.
//
// Lock order: mu guards closing, the cleanup stack and cause only; it is never held
// while waiting on QEMU or the network.
type VM struct {
	ID    string
	Dir   string
	Accel Accel

	log       *slog.Logger
	cmd       *exec.Cmd
	exited    chan struct{} // closed when QEMU has exited
	exitErr   error         // valid after exited is closed
	cause     error         // why the daemon killed QEMU, if it did (under mu)
	agent     *agentconn.Conn
	bootTime  time.Duration
	started   time.Time     // when the critical path began (launchVM, or complete for a VM launched ahead)
	phaseAt   time.Time     // the end of the last phase recorded
	ahead     *Template     // launched ahead of its request from it (Template.Prestart), or nil
	aheadOpts Options       // its options, for Template.Complete
	completed atomic.Bool   // Template.Complete was called
	incoming  *qmp          // a restore's monitor, from openIncoming to loadState
	cgroup    *cgroup.Group // nil without cgroups
	net       GuestNetwork
	console   *console
	phases    []Phase

	mu       sync.Mutex
	closed   bool
	detached bool // the host closed the agent connection on purpose (a template's save)
	cleanups []func() error
	closeErr error
}

// CPU weights (cgroup v2 scale) of background and foreground VMs.
const (
	backgroundWeight = 1
	foregroundWeight = 100
)

// Foreground gives a VM started with Options.Background the normal CPU
// weight.
func (v *VM) Foreground() error {
	if v.cgroup == nil {
		return nil
	}
	return v.cgroup.SetCPUWeight(foregroundWeight)
}

// BootDuration is the time from the start request to a VM whose agent
// answers (a cold boot or a restore).
func (v *VM) BootDuration() time.Duration { return v.bootTime }

// Phase is one step of starting a VM and its duration.
type Phase struct {
	Name string        `json:"name"`
	Dur  time.Duration `json:"ns"`
}

// Phases breaks BootDuration down: overlay, jail+qemu launch, state load
// (restores), agent connection, clock/entropy refresh.
func (v *VM) Phases() []Phase { return slices.Clone(v.phases) }

func (v *VM) phase(name string, since *time.Time) {
	now := time.Now()
	v.phases = append(v.phases, Phase{name, now.Sub(*since)})
	*since = now
}

// Gone reports whether QEMU has exited (without waiting).
func (v *VM) Gone() bool {
	select {
	case <-v.exited:
		return true
	default:
		return false
	}
}

// Exited is closed when the QEMU process has exited.
func (v *VM) Exited() <-chan struct{} { return v.exited }

// Pid is the QEMU process id.
func (v *VM) Pid() int { return v.cmd.Process.Pid }

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
	return start(ctx, opts, img, accel, launchMode{backing: img.base, readOnly: img.qemuFiles()})
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

// ramMode says where guest RAM lives.
type ramMode int

const (
	ramAnonymous  ramMode = iota // QEMU's own memory (a cold boot)
	ramSharedFile                // the file RAMFile in the VM directory, shared (a template)
	ramPrivateFD                 // a private copy-on-write mapping of fd 4 (a clone)
)

// RAMFile is a template VM's guest RAM in its directory.
const RAMFile = "ram"

// launchMode is what differs between a cold boot, a template and a clone.
type launchMode struct {
	backing  string     // the overlay's backing file
	readOnly []string   // files and directories the jail shows read-only
	ram      ramMode    // where guest RAM lives
	files    []*os.File // passed to QEMU as fds 4, 5, …
	// restore, when set, is the QMP sequence that loads the migration
	// stream (on fd 5) into a QEMU started with -incoming defer.
	restore bool
}

// start creates the VM directory and overlay, launches QEMU in its jail
// and waits for the agent.
func start(ctx context.Context, opts Options, img *imageFiles, accel Accel, m launchMode) (*VM, error) {
	v, err := launchVM(ctx, opts, img, accel, m)
	if err != nil {
		return nil, err
	}
	if err := v.complete(ctx, opts, img, m); err != nil {
		if cerr := v.Close(); cerr != nil {
			v.log.Warn("cleanup after failed start", "err", cerr)
		}
		return nil, err
	}
	return v, nil
}

// launchVM creates the VM directory and overlay and launches QEMU in its
// jail; a restore's QEMU is then up and waiting for its state (its QMP
// connection held in v.incoming). Nothing of the guest has run yet: a VM
// launched ahead (Template.Prestart) is completed later.
//
// Postcondition: on error nothing of the VM is left.
func launchVM(ctx context.Context, opts Options, img *imageFiles, accel Accel, m launchMode) (_ *VM, err error) {
	id := newID()
	v := &VM{ID: id, Accel: accel, log: opts.Log.With("vm", id), exited: make(chan struct{})}
	defer func() {
		if err != nil {
			if cerr := v.Close(); cerr != nil {
				v.log.Warn("cleanup after failed start", "err", cerr)
			}
		}
	}()
	v.started = time.Now()
	tp := v.started
	if err := v.makeDir(ctx, opts.StateDir, m.backing); err != nil {
		return nil, err
	}
	v.phase("overlay", &tp)
	if err := v.startQEMU(opts, img, accel, m); err != nil {
		return nil, err
	}
	v.phase("launch", &tp)
	if m.restore {
		bootCtx, cancel := context.WithTimeout(ctx, opts.BootTimeout)
		defer cancel()
		if err := v.openIncoming(bootCtx); err != nil {
			return nil, err
		}
		v.phase("qemu_up", &tp)
	}
	v.phaseAt = tp
	return v, nil
}

// complete brings a launched VM to one that runs commands (ready) and
// logs it. A VM launched ahead is timed from here: its phases and boot
// time are those of the request's critical path.
func (v *VM) complete(ctx context.Context, opts Options, img *imageFiles, m launchMode) error {
	if v.ahead != nil {
		v.started, v.phaseAt, v.phases = time.Now(), time.Now(), nil
	}
	tp := v.phaseAt
	if err := v.ready(ctx, opts, img, m, &tp); err != nil {
		return err
	}
	v.bootTime = time.Since(v.started)
	kind := "boot_ms"
	if m.restore {
		kind = "restore_ms"
	}
	if rep, err := v.JailReport(); err == nil {
		v.log.Info("vm ready", "accel", v.Accel, kind, v.bootTime.Milliseconds(), "ahead", v.ahead != nil, "phases", phasesString(v.phases), "jail", rep.String())
	} else {
		v.log.Warn("vm ready, jail report unavailable", "accel", v.Accel, kind, v.bootTime.Milliseconds(), "err", err)
	}
	return nil
}

// makeDir creates the VM's private directory (removed by Close) and its
// overlay on backing.
func (v *VM) makeDir(ctx context.Context, stateDir, backing string) error {
	vmsDir := filepath.Join(stateDir, "vms")
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
	return createOverlay(ctx, backing, filepath.Join(v.Dir, OverlayFile))
}

// startQEMU builds the command line, the network and the cgroup, and
// starts QEMU in its jail.
func (v *VM) startQEMU(opts Options, img *imageFiles, accel Accel, m launchMode) error {
	spec := LaunchSpec{
		QEMU: opts.QEMU, Dir: v.Dir, Kernel: img.kernel, Initrd: img.initrd,
		MemoryMiB: opts.MemoryMiB, CPUs: opts.CPUs, Accel: accel, TSCkHz: HostTSCkHz(), TCGTBSizeMiB: opts.TCGTBSizeMiB,
		Incoming: m.restore, Network: opts.Network != nil,
		// The jail passes its spec pipe as fd 3, then m.files, then the
		// console pipe.
		ConsoleFD: 4 + len(m.files),
	}
	switch m.ram {
	case ramSharedFile:
		spec.RAMPath, spec.RAMShared = filepath.Join(v.Dir, RAMFile), true
	case ramPrivateFD:
		spec.RAMPath = "/proc/self/fd/4"
	}
	argv, err := spec.Cmdline()
	if err != nil {
		return err
	}
	if opts.Network != nil {
		if err := v.startNetwork(*opts.Network, opts); err != nil {
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
	j, err := jailedCommand(argv, jailOpts{vmDir: v.Dir, readOnly: m.readOnly, accel: accel, memMiB: opts.MemoryMiB, diskMiB: img.diskMiB,
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
	return v.launch(j, argv)
}

// ready brings a started QEMU to a VM that can run a command: the saved
// state loaded (a restore), the agent connected, clock and entropy
// refreshed, the network up (with a NIC).
func (v *VM) ready(ctx context.Context, opts Options, img *imageFiles, m launchMode, tp *time.Time) error {
	bootCtx, cancel := context.WithTimeout(ctx, opts.BootTimeout)
	defer cancel()
	if m.restore {
		if err := v.loadState(bootCtx); err != nil {
			return err
		}
		v.phase("load_state", tp)
	}
	if err := v.connect(bootCtx); err != nil {
		return fmt.Errorf("vm %s: %w", v.ID, err)
	}
	v.phase("agent", tp)
	// A clone wakes with its template's clock and entropy pool: both are
	// refreshed before it is handed out.
	if err := v.refresh(bootCtx, m.restore); err != nil {
		if m.restore {
			return err
		}
		v.log.Warn("set guest clock", "err", err)
	}
	v.phase("refresh", tp)
	// The agent answers before the guest's network is up (a cold boot's
	// DHCP comes seconds later): a command must not start without it.
	if opts.Network != nil {
		if _, err := v.waitNetwork(ctx, opts.NetworkTimeout); err != nil {
			return fmt.Errorf("vm %s: %w", v.ID, err)
		}
		v.phase("network", tp)
	}
	return nil
}

// GuestNetwork is a VM's user-space network as its user sees it: a
// policy that can be replaced (netstack.Network.SetPolicy).
type GuestNetwork interface{ SetPolicy(netstack.Policy) }

// startNetwork starts the VM's user-space network, listening on its
// socket; QEMU connects when it starts. It runs in a jailed netstack
// process (package vm/netproc), except for a Config with Resolve or Dial
// set: functions cannot cross into another process, so that test
// plumbing (a fake Internet) runs the network in this process.
func (v *VM) startNetwork(cfg netstack.Config, opts Options) error {
	if cfg.Log == nil {
		cfg.Log = v.log
	}
	if cfg.Resolve != nil || cfg.Dial != nil {
		v.log.Warn("RELAXATION: the guest network runs in this process (a Resolve or Dial function is set)")
		return v.startNetworkHere(cfg)
	}
	var spec isolate.Spec
	if opts.NetstackSocket == "" {
		var err error
		if spec, err = NetstackSpec(opts.Seccomp); err != nil {
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
	p, err := netproc.Start(netproc.Config{Jail: spec, Socket: opts.NetstackSocket, Hosts: cfg.Hosts, Policy: cfg.Policy, Log: cfg.Log.With("vm", v.ID)}, lf)
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

// Network is the VM's user-space network, or nil when it has no NIC.
func (v *VM) Network() GuestNetwork { return v.net }

func phasesString(ps []Phase) string {
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%dms", p.Name, p.Dur.Milliseconds())
	}
	return b.String()
}

// openIncoming connects to a restore's QEMU, waiting until it is up
// (its QMP socket answers), and sets the migration capabilities; the
// connection is kept in v.incoming for loadState.
func (v *VM) openIncoming(ctx context.Context) error {
	q, err := dialQMP(ctx, filepath.Join(v.Dir, QMPSocket), v.exited)
	if err != nil {
		return v.failedRestore(err)
	}
	if _, err := q.run(ctx, "migrate-set-capabilities", ignoreShared); err != nil {
		q.Close()
		return v.failedRestore(err)
	}
	v.incoming = q
	// A VM closed before loadState ran (launched ahead, never used).
	v.push(func() error {
		if v.incoming != nil {
			_ = v.incoming.Close()
		}
		return nil
	})
	return nil
}

// loadState feeds the migration stream on QEMU's fd 5 into the waiting
// QEMU and lets the guest run.
func (v *VM) loadState(ctx context.Context) error {
	q := v.incoming
	if q == nil {
		return errors.New("restore: QEMU's monitor is not connected")
	}
	v.incoming = nil
	defer q.Close()
	if _, err := q.run(ctx, "migrate-incoming", map[string]any{"uri": "fd:5"}); err != nil {
		return v.failedRestore(err)
	}
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
		case <-time.After(2 * time.Millisecond):
		}
	}
	if _, err := q.run(ctx, "cont", nil); err != nil {
		return v.failedRestore(err)
	}
	return nil
}

func (v *VM) failedRestore(err error) error {
	// QEMU exits when it cannot load the stream; give it a moment so that
	// the error says why (from its log) rather than "connection reset".
	if v.isDead() {
		return v.died("during restore")
	}
	return fmt.Errorf("restore: %w; %s", err, v.consoleTail())
}

type imageFiles struct {
	base, kernel, initrd string
	diskMiB              int // the virtual disk's size
}

// qemuFiles are the image files QEMU opens: the jail shows it those and
// nothing else of the image.
func (img *imageFiles) qemuFiles() []string { return []string{img.base, img.kernel, img.initrd} }

// loadImage checks the image before QEMU starts, so a missing or damaged
// image is reported as such and not as a failed boot.
func loadImage(dir string) (*imageFiles, error) {
	if dir == "" {
		return nil, errors.New("no image directory configured")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	m, err := image.ReadManifest(abs)
	if err != nil {
		return nil, err
	}
	if err := m.CheckRunnable(abs); err != nil {
		return nil, err
	}
	if err := m.Verify(abs, false); err != nil {
		return nil, err
	}
	if err := checkQcow2(filepath.Join(abs, image.BaseFile)); err != nil {
		return nil, err
	}
	return &imageFiles{
		diskMiB: m.Inputs.DiskSizeMiB,
		base:    filepath.Join(abs, image.BaseFile),
		kernel:  filepath.Join(abs, image.KernelFile),
		initrd:  filepath.Join(abs, image.InitrdFile),
	}, nil
}

// checkQcow2 verifies the qcow2 magic, catching a truncated or replaced base
// image before QEMU does.
func checkQcow2(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != "QFI\xfb" {
		return fmt.Errorf("image: %s is not a qcow2 file", path)
	}
	return nil
}

func newID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (v *VM) push(fn func() error) {
	v.mu.Lock()
	v.cleanups = append(v.cleanups, fn)
	v.mu.Unlock()
}

func (v *VM) launch(j *isolate.Jail, argv []string) error {
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
		case <-time.After(10 * time.Second):
			return fmt.Errorf("qemu pid %d did not exit after SIGKILL", cmd.Process.Pid)
		}
	})
	go v.watchEvents()
	v.log.Debug("qemu started", "pid", cmd.Process.Pid, "argv", strings.Join(argv, " "))
	return nil
}

// died describes why QEMU is gone, with the end of the console log.
func (v *VM) died(during string) error {
	c := v.stopCause()
	if c == nil {
		c = v.ramFileFull()
	}
	if c != nil {
		return fmt.Errorf("%w %s: %w; %s", ErrVMDied, during, c, v.consoleTail())
	}
	return fmt.Errorf("%w %s: qemu exited (%v); %s", ErrVMDied, during, v.exitErr, v.consoleTail())
}

// consoleTail returns the last lines of QEMU's log and of the console,
// reading only their ends (a guest decides how much it writes).
func (v *VM) consoleTail() string {
	var parts []string
	if t := lastLines(fileTail(filepath.Join(v.Dir, QEMULog), consoleKeep), 8); t != "" {
		parts = append(parts, QEMULog+": "+t)
	}
	if v.console != nil {
		if t := v.console.tail(8); t != "" {
			parts = append(parts, ConsoleLog+": "+t)
		}
	}
	if len(parts) == 0 {
		return "no console output"
	}
	return strings.Join(parts, "; ")
}

// ErrHandshake reports that the guest agent answered, but not with a
// working hello (package agentconn).
var ErrHandshake = errors.New("agent handshake failed")

// connect dials the agent socket and waits for the agent's answer to the
// host's hello, which comes only once the guest agent runs (the readiness
// signal). A failed hello is a failed VM: the channel carries nothing but
// this one connection's bytes (a clone's agent waits on a freshly opened
// port), so there is nothing a reconnect could skip.
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
			return fmt.Errorf("boot: agent socket never appeared: %w", ctx.Err())
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
		_ = c.Close()
		return fmt.Errorf("boot: guest agent did not answer in time (%v); %s", ctx.Err(), v.consoleTail())
	case errors.Is(err, agentproto.ErrSSHAgent):
		return fmt.Errorf("%w: %w; rebuild the image (vmgated image build --force)", ErrHandshake, err)
	}
	return fmt.Errorf("%w: %w", ErrHandshake, err)
}

// ErrAgentLost reports a VM whose agent connection ended while the VM was
// in use: the guest broke the protocol or hung up. The VM is then killed:
// no command can reach it any more.
var ErrAgentLost = errors.New("guest agent connection lost")

// attach makes c the VM's agent connection, closed with the VM. The VM
// lives only as long as the connection: one that ends while the VM is in
// use (the guest hung up or broke the protocol, or a call timed out) ends
// the VM, with the reason as its cause (ErrAgentLost, unless a cause was
// set), so that whoever waits on it learns why. Only detach (a template's
// save) and Close end the connection without that.
func (v *VM) attach(c *agentconn.Conn) {
	v.agent = c
	v.push(c.Close)
	go func() {
		<-c.Done()
		err := c.Err()
		var pe *agentconn.ProtocolError
		// A QEMU that exits closes the socket first: isDead gives the
		// exit a moment, so that the VM's end says why QEMU died rather
		// than that the connection ended.
		if !errors.As(err, &pe) && v.isDead() {
			return
		}
		v.mu.Lock()
		quiet := v.detached || v.closed
		if !quiet && v.cause == nil {
			v.cause = fmt.Errorf("%w: %w", ErrAgentLost, err)
		}
		v.mu.Unlock()
		if !quiet {
			v.log.Warn("guest agent connection lost; killing the VM", "err", err)
			_ = v.Kill()
		}
	}()
}

// detach closes the agent connection without ending the VM.
func (v *VM) detach() {
	v.mu.Lock()
	v.detached = true
	v.mu.Unlock()
	_ = v.agent.Close()
}

// lost is the error of a step that found the agent connection ended: the
// VM ends with it (attach), and its end says why.
func (v *VM) lost(during string) error {
	select {
	case <-v.exited:
	case <-time.After(killWait):
	}
	return v.died(during)
}

// killWait bounds the wait for a QEMU that was sent SIGKILL.
const killWait = 10 * time.Second

// refresh sets the guest clock from the host and, with reseed, mixes 64
// bytes of host randomness into the guest's entropy pool and reseeds its
// generator, so that clones of one template never share random numbers.
func (v *VM) refresh(ctx context.Context, reseed bool) error {
	st := agentproto.SetTime{UnixNano: time.Now().UnixNano()}
	if reseed {
		st.Entropy = make([]byte, 64)
		if _, err := rand.Read(st.Entropy); err != nil {
			return fmt.Errorf("refresh: %w", err)
		}
	}
	if err := v.call(ctx, agentproto.CallSetTime, st, nil, controlTimeout); err != nil {
		return fmt.Errorf("set time: %w", err)
	}
	return nil
}

// Info asks the agent about the guest.
func (v *VM) Info() (*agentproto.Info, error) {
	var info agentproto.Info
	if err := v.call(context.Background(), agentproto.CallInfo, nil, &info, controlTimeout); err != nil {
		return nil, fmt.Errorf("info: %w", err)
	}
	return &info, nil
}

// call sends the agent a call and waits at most limit (and while ctx
// lasts and QEMU runs) for its reply, decoded into result. An agent that
// does not answer in time loses its connection: the VM is then unusable
// and the caller destroys it.
func (v *VM) call(ctx context.Context, op string, args encoding.BinaryMarshaler, result encoding.BinaryUnmarshaler, limit time.Duration) error {
	if v.agent == nil {
		return ErrClosed
	}
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- v.agent.Call(cctx, op, args, result) }()
	select {
	case err := <-done:
		switch {
		case err == nil:
			return nil
		case cctx.Err() != nil:
			// Given up: the connection goes (and with it the VM), so no
			// late reply is taken for the answer to a later call.
			why := err
			if ctx.Err() == nil {
				why = fmt.Errorf("%w: it did not answer %s within %v", ErrAgentUnresponsive, op, limit)
			}
			v.setCause(why)
			_ = v.agent.Close()
			return why
		case v.agent.Err() != nil:
			return v.lost("while waiting for the agent")
		}
		return err
	case <-v.exited:
		_ = v.agent.Close()
		<-done
		return v.died("while waiting for the agent")
	}
}

// Close kills QEMU and removes the VM's directory. It runs the cleanup stack
// in reverse order once; later calls return the first call's result.
func (v *VM) Close() error {
	v.mu.Lock()
	if v.closed {
		v.mu.Unlock()
		return v.closeErr
	}
	v.closed = true
	cl := v.cleanups
	v.cleanups = nil
	v.mu.Unlock()
	var errs []error
	for i := len(cl) - 1; i >= 0; i-- {
		if err := cl[i](); err != nil {
			errs = append(errs, err)
		}
	}
	err := errors.Join(errs...)
	v.mu.Lock()
	v.closeErr = err
	v.mu.Unlock()
	if err == nil {
		v.log.Debug("vm destroyed")
	}
	return err
}

// Kill terminates QEMU abruptly without cleaning up (fault injection and
// emergency stop); Close still has to be called.
func (v *VM) Kill() error {
	return v.cmd.Process.Signal(syscall.SIGKILL)
}

// CleanupStale removes VM directories under stateDir/vms left by a previous
// daemon that crashed, killing any QEMU still recorded there. It returns the
// number of directories removed.
func CleanupStale(stateDir string, log *slog.Logger) (int, error) {
	if log == nil {
		log = slog.Default()
	}
	vmsDir := filepath.Join(stateDir, "vms")
	ents, err := os.ReadDir(vmsDir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cleanup: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range ents {
		dir := filepath.Join(vmsDir, e.Name())
		if pid := readPid(dir); pid > 0 {
			if killed, err := killLeftoverQEMU(pid, dir); err != nil {
				log.Warn("leftover qemu not killed", "pid", pid, "dir", dir, "err", err)
			} else if killed {
				log.Warn("killed leftover qemu", "pid", pid, "dir", dir)
			}
		}
		files := dirFileNames(dir)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("removed leftover VM directory", "dir", dir, "files", files)
		n++
	}
	return n, errors.Join(errs...)
}

// killLeftoverQEMU kills pid if it is still the QEMU of dir and waits
// until it has exited, so that its cgroup can be removed next. A pidfd
// pins the process: a pid recycled after the check is never signalled.
func killLeftoverQEMU(pid int, dir string) (bool, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return false, nil
	}
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// No pidfds (a kernel before 5.3, a seccomp profile without
		// them): check, then kill by pid, without waiting.
		if !pidIsQEMUOf(pid, dir) {
			return false, nil
		}
		return true, syscall.Kill(pid, syscall.SIGKILL)
	}
	if err != nil {
		return false, fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(fd)
	if !pidIsQEMUOf(pid, dir) {
		return false, nil
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return false, nil
		}
		return false, fmt.Errorf("kill: %w", err)
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 10_000)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return true, fmt.Errorf("wait for exit: %w", err)
		}
		if n == 0 {
			return true, errors.New("still running 10 s after SIGKILL")
		}
		return true, nil
	}
}

// dirFileNames lists the names in dir (the overlay, sockets and logs of a
// VM), for the log of what a cleanup removed.
func dirFileNames(dir string) []string {
	ents, _ := os.ReadDir(dir)
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func readPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, PidFile))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// pidIsQEMUOf checks that pid is still a process whose command line names
// dir, so a recycled pid is never killed.
func pidIsQEMUOf(pid int, dir string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte(dir+"/"))
}

// JailReport describes the confinement of the VM's QEMU process.
func (v *VM) JailReport() (*isolate.Report, error) { return isolate.ReadReport(v.Pid()) }
