package e2bfront

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/internal/listenaddr"
	"github.com/vmgate/vmgate/policy"
)

// Core is the daemon as the E2B door sees it.
type Core interface {
	// Policy is the policy in force.
	Policy() *policy.Policy
	// Audit writes a record to the audit log.
	Audit(audit.Record) error
	// ListenUnix makes a Unix socket at path with the daemon socket's
	// mode and group.
	ListenUnix(path string) (net.Listener, error)
	// Dial opens a connection to the daemon's local API on which every
	// request is id's: the same decisions, audit, limits and sessions
	// as a local caller's, for the key's profile.
	Dial(ctx context.Context, id policy.Identity) (net.Conn, error)
}

// Config configures the E2B door. Zero limits get the defaults.
type Config struct {
	// Listen holds the addresses to serve ("127.0.0.1:3000",
	// "unix:/run/vmgate/e2b.sock"); TCP ones must be loopback unless
	// AllowRemote is set.
	Listen []string
	// Listeners are open listeners to serve as well (tests); closed at
	// shutdown.
	Listeners []net.Listener
	// AllowRemote permits non-loopback TCP addresses: a logged relaxation.
	AllowRemote bool
	// Keys is the keys file; required.
	Keys string
	// State is the file the sandboxes' records are kept in, so that a
	// paused sandbox outlives the daemon (default STATE/e2b-sandboxes.json).
	State string
	// MaxBody bounds a control-plane or RPC request body (default 1 MiB);
	// MaxUpload bounds a POST /files body (default 1 GiB).
	MaxBody   int64
	MaxUpload int64
	// MaxStreams bounds one sandbox's open process streams (default 32).
	MaxStreams int
	// MaxPage bounds a list's page (default and most: 100).
	MaxPage int
	// DefaultTimeout is a sandbox's lifetime when create names none
	// (default 300s, as E2B's).
	DefaultTimeout time.Duration
	// Keepalive is the interval of keepalive events on idle streams
	// (default 50s).
	Keepalive time.Duration
}

// DefaultState is the sandboxes' file under the state directory.
const DefaultState = "e2b-sandboxes.json"

func (c *Config) setDefaults(stateDir string) {
	if c.State == "" {
		c.State = stateDir + "/" + DefaultState
	}
	if c.MaxBody == 0 {
		c.MaxBody = 1 << 20
	}
	if c.MaxUpload == 0 {
		c.MaxUpload = 1 << 30
	}
	if c.MaxStreams == 0 {
		c.MaxStreams = 32
	}
	if c.MaxPage == 0 {
		c.MaxPage = 100
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 300 * time.Second
	}
	if c.Keepalive == 0 {
		c.Keepalive = 50 * time.Second
	}
}

// Front is the E2B door.
type Front struct {
	core  Core
	cfg   Config
	log   *slog.Logger
	keys  atomic.Pointer[Keys]
	boxes *sandboxes
	srv   *http.Server
	lns   []doorListener
	wg    sync.WaitGroup
	// hosts are the Host header values the door answers to (DNS
	// rebinding); anyHost is set when a Unix socket is served.
	hosts map[string]bool
	// ptys are the terminal commands the door holds (pty.go); ctx ends
	// them at Close.
	ptys ptys
	ctx  context.Context
	stop context.CancelFunc
}

type doorListener struct {
	ln   net.Listener
	unix string
}

// New loads the keys, checks them against the policy, reads the
// sandboxes' records and opens the listeners. Nothing is served until
// Serve. On error no listener is left open.
func New(core Core, cfg Config, stateDir string, log *slog.Logger) (_ *Front, err error) {
	cfg.setDefaults(stateDir)
	log = log.With("front", "e2b")
	f := &Front{core: core, cfg: cfg, log: log, hosts: map[string]bool{}}
	f.ctx, f.stop = context.WithCancel(context.Background())
	for _, ln := range cfg.Listeners {
		f.lns = append(f.lns, doorListener{ln: ln})
	}
	defer func() {
		if err != nil {
			f.CloseListeners()
		}
	}()
	if cfg.Keys == "" {
		return nil, errors.New("e2b: no keys file (--e2b-keys)")
	}
	if len(cfg.Listen) == 0 && len(cfg.Listeners) == 0 {
		return nil, errors.New("e2b: no address to listen on (--e2b-listen)")
	}
	addrs, remote, err := listenaddr.ParseAll("e2b", cfg.Listen, cfg.Listeners)
	if err != nil {
		return nil, err
	}
	if len(remote) > 0 {
		if !cfg.AllowRemote {
			return nil, fmt.Errorf("e2b: refusing to listen on %s, which is not a loopback address: the keys would be the only barrier against the network, over plain HTTP (pass --e2b-allow-remote to accept that)", strings.Join(remote, ", "))
		}
		log.Warn("RELAXATION: the E2B door listens on non-loopback addresses (--e2b-allow-remote): its keys and access tokens cross the network in plain HTTP", "addrs", remote)
	}
	keys, err := LoadKeys(cfg.Keys)
	if err != nil {
		return nil, err
	}
	if errs := checkKeyProfiles(keys, core.Policy()); len(errs) > 0 {
		return nil, fmt.Errorf("e2b: %w", errors.Join(errs...))
	}
	if keys.Len() == 0 {
		log.Warn("the E2B keys file lists no key: nobody can create a sandbox", "file", cfg.Keys)
	}
	f.keys.Store(keys)
	if f.boxes, err = loadSandboxes(cfg.State, log); err != nil {
		return nil, fmt.Errorf("e2b: %w", err)
	}
	for _, la := range addrs {
		ln, err := la.Listen(core.ListenUnix)
		if err != nil {
			return nil, fmt.Errorf("e2b: %w", err)
		}
		l := doorListener{ln: ln}
		if la.Network == "unix" {
			l.unix = la.Addr
		}
		f.lns = append(f.lns, l)
	}
	for _, l := range f.lns {
		f.addHosts(l.ln.Addr())
	}
	f.srv = &http.Server{Handler: f.routes(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return context.Background() }}
	return f, nil
}

// addHosts adds the Host header values that name addr: its IP and port,
// and localhost with the port for a loopback address. A Unix socket
// cannot be reached from a browser, so any Host is accepted there.
func (f *Front) addHosts(addr net.Addr) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		f.hosts["*"] = true
		return
	}
	ap := ta.AddrPort()
	ip := ap.Addr().Unmap()
	port := ap.Port()
	names := []netip.Addr{ip}
	if ip.IsUnspecified() {
		// Every interface: the host's own addresses are not known here,
		// so IP literals are accepted (a rebinding attack needs a name).
		f.hosts["ip:*:"+fmt.Sprint(port)] = true
	}
	for _, n := range names {
		f.hosts[netip.AddrPortFrom(n, port).String()] = true
	}
	if ip.IsLoopback() {
		f.hosts[fmt.Sprintf("localhost:%d", port)] = true
		f.hosts[netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port).String()] = true
		f.hosts[netip.AddrPortFrom(netip.IPv6Loopback(), port).String()] = true
	}
}

// hostAllowed reports whether a request's Host header names this door.
func (f *Front) hostAllowed(host string) bool {
	if f.hosts["*"] || f.hosts[strings.ToLower(host)] {
		return true
	}
	ap, err := netip.ParseAddrPort(host)
	return err == nil && f.hosts[fmt.Sprintf("ip:*:%d", ap.Port())]
}

// checkKeyProfiles reports the keys whose profile pol does not give them.
func checkKeyProfiles(keys *Keys, pol *policy.Policy) []error {
	var errs []error
	for _, k := range keys.All() {
		if err := pol.CheckDoorKeyProfile(policy.DoorE2B, k.Profile); err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: key %s: %w", keys.Source(), k.Line, k.Fingerprint, err))
		}
	}
	return errs
}

// Serve starts serving every listener.
func (f *Front) Serve() {
	for _, l := range f.lns {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := f.srv.Serve(l.ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
				f.log.Error("e2b listener failed", "addr", l.ln.Addr().String(), "err", err)
			}
		}()
	}
	f.boxes.startTimers(f)
}

// LogReady logs where the door listens.
func (f *Front) LogReady() {
	var addrs []string
	for _, l := range f.lns {
		addrs = append(addrs, l.ln.Addr().String())
	}
	f.log.Info("E2B door ready", "listen", addrs, "keys", f.cfg.Keys, "sandboxes", f.boxes.count())
}

// CloseListeners stops accepting and removes the door's Unix sockets.
func (f *Front) CloseListeners() {
	for _, l := range f.lns {
		_ = l.ln.Close()
		if l.unix != "" {
			_ = os.Remove(l.unix)
		}
	}
}

// Close ends the door's connections (streams end; their processes go
// on in their sandboxes) and stops its timers.
func (f *Front) Close() {
	if f.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = f.srv.Shutdown(ctx)
		cancel()
		_ = f.srv.Close()
	}
	f.wg.Wait()
	f.stop()
	if f.boxes != nil {
		f.boxes.stopTimers()
	}
}

// Reload reads the keys file again (SIGHUP). A file that does not parse
// keeps the old keys.
func (f *Front) Reload(pol *policy.Policy) {
	keys, err := LoadKeys(f.cfg.Keys)
	if err != nil {
		f.log.Error("e2b keys reload failed, keeping the old keys", "err", err)
		_ = f.core.Audit(audit.Record{Kind: audit.KindDaemon, Message: "e2b keys reload failed", Error: err.Error()})
		return
	}
	for _, err := range checkKeyProfiles(keys, pol) {
		f.log.Warn("e2b key cannot get its profile; its requests will be denied", "err", err)
	}
	f.keys.Store(keys)
	f.log.Info("e2b keys reloaded", "file", keys.Source(), "keys", keys.Len())
	_ = f.core.Audit(audit.Record{Kind: audit.KindDaemon, Message: fmt.Sprintf("e2b keys reloaded: %s (%d keys)", keys.Source(), keys.Len())})
}

// caller is the identity of a key's requests.
func caller(k *Key, remote string) policy.Identity {
	return policy.Identity{SSH: &policy.SSHKey{Door: policy.DoorE2B, Profile: k.Profile, Fingerprint: k.Fingerprint,
		Comment: k.Comment, RemoteAddr: remote}}
}

// apiFor is the daemon's API as id.
func (f *Front) apiFor(id policy.Identity) *client.Client {
	return &client.Client{Socket: "@e2b", Dial: func(ctx context.Context) (net.Conn, error) { return f.core.Dial(ctx, id) }}
}
