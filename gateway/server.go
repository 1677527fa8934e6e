package gateway

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/e2bfront"
	"github.com/vmgate/vmgate/gateway/sshfront"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

// Config configures the daemon. Zero values get the documented defaults.
type Config struct {
	// Socket is the Unix socket path (default /run/vmgate/vmgate.sock).
	// Ignored under systemd socket activation.
	Socket string
	// SocketGroup, if set, owns the socket (mode 0660).
	SocketGroup string
	// SocketMode defaults to 0660.
	SocketMode os.FileMode
	// PolicyPath is the TOML policy. When empty or, for the default path,
	// missing, the embedded default policy is used.
	PolicyPath string
	// PolicyExplicit makes a missing PolicyPath an error.
	PolicyExplicit bool
	// VM is the VM layer's own configuration: the state directory (VM
	// directories, and the daemon's lock, keys and default audit log),
	// the guest image (default STATE/image), templates, the accelerator
	// and the pools. The daemon fills in its Cgroups (the policy's mode)
	// and Network (the resolver, from NetHosts); its Log defaults to Log.
	// Its directories may be reached through symlinks: New resolves
	// them (paths.go).
	VM vm.HostConfig
	// AuditPath is the audit log (JSON lines, hash-chained).
	AuditPath string
	// AuditRedact are regular expressions; argv elements matching one are
	// written to the audit log as "[REDACTED]".
	AuditRedact []string
	// ReceiptKey is the ed25519 key that signs receipts and the audit
	// chain's checkpoints (receipt.LoadKey's rules). Empty means
	// STATE/receipt.key, created at first start; a key given here must
	// exist. The daemon does not start without its key.
	ReceiptKey string
	// CheckpointEvery and CheckpointInterval say how often the audit log
	// signs its chain: after so many records, and at least so often while
	// records are written (defaults audit.DefaultCheckpointEvery and
	// audit.DefaultCheckpointInterval; a negative interval: no timer).
	CheckpointEvery    int
	CheckpointInterval time.Duration
	// MaxVMs bounds live VMs across all callers (default 4).
	MaxVMs int
	// QueueLen bounds requests waiting for a VM slot (default 16; negative
	// means no queue: busy at once when all slots are taken);
	// QueueWait bounds how long each waits (default 30s).
	QueueLen  int
	QueueWait time.Duration
	// Grace is how long running commands may finish after SIGTERM before
	// they are killed (default 10s).
	Grace time.Duration
	// Seccomp overrides the policy's [isolate] seccomp ("required" or
	// "off"); empty means the policy decides (default required).
	Seccomp string
	// NetHosts pins guest DNS names to addresses (looked up before the
	// host's resolver; the allowlist and address checks still apply).
	NetHosts map[string][]netip.Addr
	// MetricsListen, when set, also serves GET /metrics on this loopback
	// TCP address (it is always on the socket).
	MetricsListen string
	// SSH, if set, turns the SSH front door on.
	SSH *sshfront.Config
	// E2B, if set, turns the E2B door on (docs/e2b.md).
	E2B *e2bfront.Config
	// MaxConnsPerUID bounds one uid's open connections to the socket
	// (default DefaultMaxConnsPerUID); ConnIdle closes a kept-alive
	// connection without a request (default DefaultConnIdle).
	MaxConnsPerUID int
	ConnIdle       time.Duration
	// AuditFlood bounds the records that nothing ran for: the denied
	// requests of one caller, and the refused network events of one VM,
	// each written at most Burst at once and Rate per second; the rest
	// are counted in summary records (default DefaultAuditFlood).
	AuditFlood AuditFlood
	// AllowRoot permits running as uid 0.
	AllowRoot bool
	// Log defaults to slog.Default().
	Log *slog.Logger
}

// AuditFlood is the rate limit of one kind of record per source.
type AuditFlood struct {
	DenyRate, NetRate   float64 // records per second
	DenyBurst, NetBurst int
}

// DefaultAuditFlood: a caller's denied requests 10/s after a burst of
// 100; a VM's refused network events 20/s after a burst of 200.
var DefaultAuditFlood = AuditFlood{DenyRate: 10, DenyBurst: 100, NetRate: 20, NetBurst: 200}

// stuckAfterKill bounds a stop's wait for the requests in flight once the
// grace period is over and they were killed.
const stuckAfterKill = 2 * time.Second

// Defaults of Config's zero values, and of vmgated serve's flags.
const (
	DefaultMaxVMs    = 4
	DefaultQueueLen  = 16
	DefaultQueueWait = 30 * time.Second
	DefaultGrace     = 10 * time.Second
	// DefaultPoolSize is vmgated serve's --pool; a Config's zero
	// PoolSize means no pool.
	DefaultPoolSize = 1
	// DefaultAhead is vmgated serve's --ahead; a Config's zero Ahead
	// means none.
	DefaultAhead = 1
)

func (c *Config) setDefaults() {
	if c.Socket == "" {
		c.Socket = wire.DefaultSocket
	}
	if c.SocketMode == 0 {
		c.SocketMode = 0o660
	}
	if c.AuditPath == "" {
		c.AuditPath = filepath.Join(c.VM.StateDir, "audit.jsonl")
	}
	if c.MaxVMs == 0 {
		c.MaxVMs = DefaultMaxVMs
	}
	switch {
	case c.QueueLen == 0:
		c.QueueLen = DefaultQueueLen
	case c.QueueLen < 0:
		c.QueueLen = 0
	}
	if c.QueueWait == 0 {
		c.QueueWait = DefaultQueueWait
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.MaxConnsPerUID == 0 {
		c.MaxConnsPerUID = DefaultMaxConnsPerUID
	}
	if c.ConnIdle == 0 {
		c.ConnIdle = DefaultConnIdle
	}
	if c.AuditFlood == (AuditFlood{}) {
		c.AuditFlood = DefaultAuditFlood
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.VM.Log == nil {
		c.VM.Log = c.Log
	}
}

// Server is a running gateway: its exec core and local API, its
// sessions, and what it was made of.
type Server struct {
	cfg Config
	log *slog.Logger
	pol atomic.Pointer[policy.Policy]
	// rec writes the audit log (with the flood gates) and counts the
	// metrics.
	rec     *recorder
	metrics *metrics
	slots   *slots
	// host is where VMs come from: the image, the cgroups, templates
	// and pools.
	host *vm.Host
	// flight holds the requests in flight (lease.go).
	flight   *inflight
	sessions *sessions
	// live holds the commands running now, by request id (status).
	live *liveExecs
	// door serves the local API to front doors inside the daemon
	// (dialAs).
	door *doorListener
	// e2b is the E2B door; nil when off.
	e2b *e2bfront.Front
	// ssh is the SSH front door; nil when off.
	ssh *sshfront.Front
	// links are the image directories as configured, which each reload
	// resolves again (paths.go); cfg holds the directories resolved.
	links imageLinks
	// receiptKey signs receipts and the audit chain's checkpoints.
	receiptKey ed25519.PrivateKey
	// reloadErr is why the last policy reload failed (nil: it did not).
	reloadErr atomic.Pointer[error]

	// closers undo New, in reverse order (Close).
	closers []func() error
}

// Run is the daemon: New, then Listen, Serve until ctx is cancelled or
// SIGTERM/SIGINT arrives (SIGHUP reloads the policy), and Close. It returns
// after every VM is destroyed and the socket it created is removed.
func Run(ctx context.Context, cfg Config) error {
	// Signals are caught before anything else, so that a reload sent right
	// after readiness cannot kill the daemon with the default action.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	s, err := New(cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	ln, owned, err := Listen(s.cfg, s.log)
	if err != nil {
		return err
	}
	if owned {
		defer os.Remove(s.cfg.Socket)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- s.Serve(sctx, ln) }()
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				s.Reload()
				continue
			}
			s.log.Info("shutting down", "signal", sig.String())
			stop()
			return <-served
		case <-ctx.Done():
			s.log.Info("shutting down", "reason", ctx.Err())
			return <-served
		case err := <-served:
			return err
		}
	}
}

// New prepares the daemon from cfg: the state directory and its lock, the
// receipt signing key, the policy, the VM host (which cleans up what a
// crashed daemon left, opens the cgroups and checks the image), the audit
// log, the SSH front door's files; then the templates of the policy's
// shapes start loading. It neither listens nor serves.
//
// Postcondition: on error everything it acquired is released again.
func New(cfg Config) (_ *Server, err error) {
	cfg.setDefaults()
	log := cfg.Log
	s := &Server{cfg: cfg, log: log, metrics: newMetrics(), live: newLiveExecs(), flight: newInflight(), door: newDoorListener()}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	s.push(func() error { s.flight.kill(); return nil })
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if s.links, err = resolveDirs(&cfg, log); err != nil {
		return nil, err
	}
	s.cfg = cfg
	unlock, err := lockState(cfg.VM.StateDir)
	if err != nil {
		return nil, err
	}
	s.push(func() error { unlock(); return nil })
	// No receipts, no start: the key is checked before any VM work.
	if s.receiptKey, err = loadReceiptKey(cfg, log); err != nil {
		return nil, err
	}
	pol, err := loadPolicy(cfg, log)
	if err != nil {
		return nil, err
	}
	s.pol.Store(pol)
	hc := cfg.VM
	hc.Cgroups, hc.Network, hc.GuestASLR = pol.Cgroups(), netBase(cfg), pol.GuestASLR()
	s.host, err = vm.NewHost(hc)
	if err != nil {
		return nil, err
	}
	// Pushed before anything that runs VMs, so it runs after every VM
	// (sessions, requests) is gone.
	s.push(s.host.Close)
	if cfg.MetricsListen != "" {
		ln, err := listenMetrics(cfg.MetricsListen)
		if err != nil {
			return nil, err
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /metrics", s.handleMetrics)
		ms := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = ms.Serve(ln) }()
		s.push(ms.Close)
		log.Info("metrics", "listen", ln.Addr().String())
	}
	if err := s.useImages(pol); err != nil {
		return nil, err
	}
	al, err := audit.Open(audit.Options{Path: cfg.AuditPath, Redact: cfg.AuditRedact, Logger: log, Mirror: journalMirror(),
		Signer: &audit.Signer{Key: s.receiptKey, Every: cfg.CheckpointEvery, Interval: cfg.CheckpointInterval}})
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	s.push(al.Close)
	s.rec = newRecorder(al, cfg.AuditFlood, s.metrics, log)
	stopSweeper := s.rec.sweeper()
	s.push(func() error { stopSweeper(); return nil })
	s.slots = newSlots(cfg.MaxVMs, cfg.QueueLen, cfg.QueueWait)
	// Paused sessions outlive the daemon; the ones that were running when
	// it died are reported lost.
	s.sessions = newSessions(s, s.host, s.slots, s.rec, log, cfg.VM.StateDir, cfg.QueueWait, cfg.Grace)
	s.sessions.load()
	// The SSH front door's files and addresses are checked before any VM
	// work starts; it serves once the daemon is ready.
	if cfg.SSH != nil {
		sc := *cfg.SSH
		if sc.CallerOf == nil {
			// A subordinate uid counts as its login, as on the socket.
			sc.CallerOf = newPeerResolver(DefaultSubUIDFile, log).callerOf
		}
		if s.ssh, err = sshfront.New(sshCore{doorCore{s}}, sc, cfg.VM.StateDir, log); err != nil {
			return nil, err
		}
		s.push(func() error { s.ssh.CloseListeners(); return nil })
	}
	if cfg.E2B != nil {
		if s.e2b, err = e2bfront.New(e2bCore{doorCore{s}}, *cfg.E2B, cfg.VM.StateDir, log); err != nil {
			return nil, err
		}
		s.push(func() error { s.e2b.CloseListeners(); return nil })
	}
	s.warmShapes(pol)
	if cfg.Seccomp == "" && pol.Seccomp() == "off" {
		log.Warn("RELAXATION: SECCOMP WARNING: the policy sets isolate.seccomp = \"off\"")
	}
	return s, nil
}

// checkConfig refuses what the daemon must not run with, and logs the
// relaxations it may.
func checkConfig(cfg Config) error {
	if os.Geteuid() == 0 && !cfg.AllowRoot {
		return errors.New("refusing to run as root: run vmgated as its own unprivileged user (vmgate), or pass --allow-root")
	}
	if os.Geteuid() == 0 {
		cfg.Log.Warn("RELAXATION: running as root (--allow-root); QEMU and VM files are owned by root")
	}
	switch cfg.Seccomp {
	case "", "required":
	case "off":
		cfg.Log.Warn("RELAXATION: SECCOMP WARNING: the jail's seccomp filter is off (--seccomp off)")
	default:
		return fmt.Errorf("seccomp %q: want required or off", cfg.Seccomp)
	}
	if cfg.VM.StateDir == "" {
		return errors.New("no state directory")
	}
	return nil
}

// warmShapes starts loading (or building) the templates of the default
// shape and of every shape the policy uses. A shape that only a later
// policy uses is built on first use.
func (s *Server) warmShapes(pol *policy.Policy) {
	s.host.Warm(vm.Shape{MemoryMiB: vm.DefaultMemoryMiB, CPUs: vm.DefaultCPUs, Seccomp: s.seccompMode()})
	networked := false
	for _, sh := range pol.Shapes() {
		s.host.Warm(vm.Shape{Image: sh.Image, MemoryMiB: sh.MemoryMiB, CPUs: sh.CPUs, DiskMiB: sh.DiskMiB, Seccomp: s.seccompMode(), Network: sh.Network})
		networked = networked || sh.Network
	}
	switch {
	case networked && s.cfg.VM.NetstackSocket != "":
		s.log.Info("guest networks: one netstack per VM, started by systemd", "netstack_socket", s.cfg.VM.NetstackSocket)
	case networked:
		s.log.Warn("RELAXATION: guest networks: each VM's netstack runs jailed by vmgated in the host's network namespace (it dials the guest's allowed connections); under systemd, --netstack-socket runs them in vmgate-netstack@.service instead")
	}
}

// push adds a step to what Close undoes, in reverse order.
func (s *Server) push(fn func() error) { s.closers = append(s.closers, fn) }

// Close releases what New acquired, in reverse order: the audit log, the
// VM host's pools, templates and cgroups, the state lock. Call it after
// Serve has returned (or instead of Serve). It is safe to call twice.
func (s *Server) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	s.closers = nil
	return errors.Join(errs...)
}

// Serve serves the local API on ln (and the SSH front door) until ctx ends,
// then shuts down: no new requests, running commands get the grace period,
// then they are killed and every session's VM destroyed. It tells systemd
// once it serves, and returns when every command has ended.
// It does not close ln's socket file (Run does, for a socket it made).
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: s.routes(), ConnContext: connContext, ReadHeaderTimeout: requestReadTimeout, IdleTimeout: s.cfg.ConnIdle}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(newUIDLimitListener(ln, s.cfg.MaxConnsPerUID, s.log)) }()
	go func() { _ = srv.Serve(s.door) }()
	if s.ssh != nil {
		s.ssh.Serve()
		s.ssh.LogReady()
	}
	if s.e2b != nil {
		s.e2b.Serve()
		s.e2b.LogReady()
	}
	_ = s.rec.Write(audit.Record{Kind: audit.KindDaemon, Message: "started", ImageDigest: s.host.ImageDigest()})
	// The chain names this run's key from its start.
	if _, err := s.rec.Checkpoint("daemon started"); err != nil {
		s.log.Error("audit checkpoint at start", "err", err)
	}
	s.log.Info("vmgated ready", "socket", ln.Addr().String(), "policy", s.pol.Load().Source(), "image", s.cfg.VM.ImageDir,
		"audit", s.cfg.AuditPath, "max_vms", s.cfg.MaxVMs)
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		s.log.Warn("sd_notify READY", "err", err)
	}
	stopReaper := s.sessions.startReaper()
	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		runErr = fmt.Errorf("serve: %w", err)
	}
	stopReaper()
	s.shutdown(srv)
	_ = s.rec.Write(audit.Record{Kind: audit.KindDaemon, Message: "stopped"})
	return runErr
}

func (s *Server) shutdown(srv *http.Server) {
	s.flight.stop()
	_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
	if s.ssh != nil {
		s.ssh.CloseListeners()
	}
	if s.e2b != nil {
		// Its calls end now (a second for the short ones): a stream only
		// watches a process, which stays its session's.
		s.e2b.CloseListeners()
		s.e2b.Close()
	}
	grace := time.NewTimer(s.cfg.Grace)
	defer grace.Stop()
	// Stop accepting and serve what is queued; hijacked exec connections
	// are not tracked by srv but by their leases.
	go func() {
		sctx, cancel := context.WithTimeout(context.Background(), s.cfg.Grace)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	select {
	case <-s.flight.idle:
	case <-grace.C:
		s.log.Warn("grace period over, killing running commands and booting VMs", "grace", s.cfg.Grace)
		s.flight.kill()
		// Killed requests end at once; one that does not (stuck in a
		// system call the daemon cannot interrupt) must not cost every
		// session: the stop goes on to pause them.
		select {
		case <-s.flight.idle:
		case <-time.After(stuckAfterKill):
			s.log.Error("requests still in flight after they were killed; pausing the sessions anyway", "requests", s.flight.count(), "waited", stuckAfterKill)
		}
	}
	_ = srv.Close()
	if s.ssh != nil {
		s.ssh.CloseConns()
	}
	// Sessions are paused, not destroyed: they resume after the next
	// start.
	s.sessions.pauseAll()
}

// enter takes a lease for a request in flight (lease.go).
func (s *Server) enter(ctx context.Context) (*lease, *RequestError) { return s.flight.enter(ctx) }

// policyNow is the policy in force.
func (s *Server) policyNow() *policy.Policy { return s.pol.Load() }

// shape is the VM shape of a verdict, as the host makes VMs (Normal: a
// session's shape compares equal to it).
func (s *Server) shape(v policy.Verdict) vm.Shape {
	mem, cpus := v.Limits.MemoryMiB, v.Limits.CPUs
	if mem == 0 {
		mem = vm.DefaultMemoryMiB
	}
	if cpus == 0 {
		cpus = vm.DefaultCPUs
	}
	return vm.Shape{Image: v.Image, MemoryMiB: mem, CPUs: cpus, DiskMiB: v.Limits.DiskMiB, Seccomp: s.seccompMode(), Network: v.Network != nil}.Normal()
}

// netBase is the plumbing of every VM network (the daemon's resolver and
// log) with no policy: it allows nothing until SetPolicy.
func netBase(cfg Config) netstack.Config {
	return netstack.Config{Hosts: cfg.NetHosts, Log: cfg.Log}
}

// seccompMode is the jail's filter mode for new VMs.
func (s *Server) seccompMode() string {
	if s.cfg.Seccomp != "" {
		return s.cfg.Seccomp
	}
	return s.pol.Load().Seccomp()
}

// Reload reads the policy again (SIGHUP); a policy that does not load
// leaves the old one in force, logged and audited.
func (s *Server) Reload() {
	// logrotate moved the audit log away before it sent SIGHUP: continue
	// the chain in a new file.
	if rotated, err := s.rec.Reopen(""); err != nil {
		s.log.Error("audit log reopen failed; writing on to the old file", "err", err)
	} else if rotated {
		seq, head := s.rec.Head()
		s.log.Info("audit log rotated", "seq", seq, "head", head)
	}
	p, err := loadPolicy(s.cfg, s.log)
	if err == nil {
		err = s.useImages(p) // images are resolved again (paths.go)
	}
	if err != nil {
		s.log.Error("policy reload failed, keeping the old policy", "err", err)
		s.reloadErr.Store(&err)
		_ = s.rec.Write(audit.Record{Kind: audit.KindDaemon, Message: "policy reload failed", Error: err.Error()})
		return
	}
	s.reloadErr.Store(nil)
	s.pol.Store(p)
	s.log.Info("policy reloaded", "source", p.Source())
	_ = s.rec.Write(audit.Record{Kind: audit.KindDaemon, Message: "policy reloaded: " + p.Source()})
	if s.ssh != nil {
		s.ssh.Reload(p)
	}
	if s.e2b != nil {
		s.e2b.Reload(p)
	}
	s.sessions.recheckPublications(p)
	s.sessions.renetwork(p)
}

func loadPolicy(cfg Config, log *slog.Logger) (*policy.Policy, error) {
	if cfg.PolicyPath == "" {
		log.Info("no policy file configured, using the embedded default policy")
		return policy.Default(), nil
	}
	p, err := policy.Load(cfg.PolicyPath)
	if errors.Is(err, fs.ErrNotExist) && !cfg.PolicyExplicit {
		log.Info("policy file not found, using the embedded default policy", "path", cfg.PolicyPath)
		return policy.Default(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	// Secrets' values are read now, at start and at each reload; one
	// that cannot be read refuses the policy.
	if err := p.ReadSecrets(os.Getenv("CREDENTIALS_DIRECTORY")); err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	return p, nil
}

// Listen returns the listener systemd passed (socket activation), or
// creates the socket cfg.Socket; owned reports the latter: the caller
// removes the socket file when done.
func Listen(cfg Config, log *slog.Logger) (ln net.Listener, owned bool, err error) {
	lns, err := activation.Listeners()
	if err != nil {
		return nil, false, fmt.Errorf("socket activation: %w", err)
	}
	switch len(lns) {
	case 0:
	case 1:
		if lns[0] == nil {
			return nil, false, errors.New("socket activation: the passed socket is not a listener")
		}
		log.Info("using the socket passed by systemd", "addr", lns[0].Addr().String())
		return lns[0], false, nil
	default:
		return nil, false, fmt.Errorf("socket activation: want 1 socket, got %d", len(lns))
	}
	ln, err = listenUnix(cfg.Socket, cfg.SocketMode, cfg.SocketGroup, log)
	return ln, err == nil, err
}

// listenUnix creates a Unix socket at path with mode and, if group is
// set, that group. A stale socket file is removed; one that a running
// process answers on, or a file that is not a socket, is an error.
func listenUnix(path string, mode os.FileMode, group string, log *slog.Logger) (net.Listener, error) {
	if len(path) >= 108 {
		return nil, fmt.Errorf("socket path %s is too long (max 107 bytes)", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	// A socket file that nobody answers on is stale; one that answers
	// belongs to a running daemon, which we must not steal it from.
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("another vmgated is already listening on %s", path)
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket; refusing to remove it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket: %w", err)
		}
		log.Info("removed stale socket", "path", path)
	}
	ln, err := bindPrivate(path)
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	gid := -1
	if group != "" {
		g, err := user.LookupGroup(group)
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket group: %w", err)
		}
		gid, _ = strconv.Atoi(g.Gid)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("socket group: %w", err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	return ln, nil
}

// bindPrivate listens on a Unix socket at path whose file is created with
// mode 0600 at most. The mode is set on the socket before bind (Linux
// gives the socket file the socket inode's mode, less the umask), so the
// process umask is never touched: it is shared by every thread, and a
// directory created meanwhile (a VM's, by the template build that starts
// with the daemon) would lose its search bit, which the jail then cannot
// pass (CI once failed so: "bind …/vms/ID: lstat: permission denied").
func bindPrivate(path string) (net.Listener, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := unix.Fchmod(fd, 0o600); err != nil {
		return nil, os.NewSyscallError("fchmod", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		return nil, os.NewSyscallError("bind", err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		_ = os.Remove(path)
		return nil, os.NewSyscallError("listen", err)
	}
	ln, err := net.FileListener(f)
	if err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	return ln, nil
}

// lockState makes sure only one daemon owns a state directory (it cleans
// up VM directories it finds there at start).
func lockState(dir string) (func(), error) {
	p := filepath.Join(dir, "vmgated.lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another vmgated uses the state directory %s (lock %s held)", dir, p)
	}
	return func() { f.Close() }, nil
}
