package sshfront

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/sshkeys"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/listenaddr"
	"github.com/vmgate/vmgate/policy"
)

// Core is the daemon as the front door sees it: the policy in force, the
// audit log, its way of making Unix sockets, and its exec core.
type Core interface {
	// Policy is the policy in force.
	Policy() *policy.Policy
	// Audit writes a record to the audit log.
	Audit(audit.Record) error
	// ListenUnix makes a Unix socket at path with the daemon socket's
	// mode and group.
	ListenUnix(path string) (net.Listener, error)
	// Exec takes one request through the exec core (decision, audit, a
	// VM, the command) with the front door's streams. It returns when
	// the command is over, was refused, or was killed (r.Gone closed, or
	// the daemon's shutdown grace period ended).
	Exec(ctx context.Context, log *slog.Logger, r Request) Outcome
}

// Request is one command or shell for Core.Exec.
type Request struct {
	ID   policy.Identity
	Exec *wire.ExecRequest
	// Interactive marks a login shell on a terminal (a session without a
	// command); Exec.Argv is then the shell.
	Interactive    bool
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Signals carries RFC 4254 signal names to the command.
	Signals <-chan string
	// Resize carries new terminal sizes of a TTY command (Cols, Rows).
	Resize <-chan wire.TTY
	// Gone is closed when the client went away.
	Gone <-chan struct{}
	// Refused, when set, is the front door's own refusal of the request
	// (a login it cannot serve): the core audits it as a denial, through
	// its flood gate, and refuses it.
	Refused error
	// Admitted, when set, is called once the request is admitted, before
	// the command starts, with the limits it runs under.
	Admitted func(policy.Limits)
}

// Outcome is how a request ended.
type Outcome struct {
	RequestID string
	// Limits are the ones the request ran under (once admitted).
	Limits policy.Limits
	// Refused is set when the request did not run: refused by the policy,
	// busy, no VM, shutting down. Nothing was written to the streams.
	Refused *wire.Error
	Result  wire.Result
	// Err means the outcome is unknown: the VM failed, the client went
	// away, or the shutdown grace period ended (Stopping).
	Err      error
	Stopping bool
}

// Front is the SSH front door: its listeners, its connections and the
// authorized keys (replaced on SIGHUP).
type Front struct {
	core   Core
	cfg    Config
	log    *slog.Logger
	config *ssh.ServerConfig
	keys   atomic.Pointer[sshkeys.Set]
	lns    []listener
	budget *budget   // connections against their limits (limits.go)
	warn   *burstLog // refusals, logged once per burst
	hostFP string    // the host key's fingerprint
	// procNet holds the TCP socket tables (procNetTCP; tests).
	procNet string

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // accept loops and connections
}

type listener struct {
	ln   net.Listener
	unix string // socket path to remove at shutdown; "" for TCP
}

// New loads the keys and the host key (default under stateDir), checks
// the keys against the policy in force, and opens the listeners. Nothing
// is served until Serve.
//
// Postcondition: on error no listener is left open.
func New(core Core, cfg Config, stateDir string, log *slog.Logger) (_ *Front, err error) {
	cfg.setDefaults(stateDir)
	log = log.With("front", "ssh")
	pol := core.Policy()
	f := &Front{core: core, cfg: cfg, log: log, conns: map[net.Conn]struct{}{}, procNet: procNetTCP,
		budget: newBudget(cfg.MaxUnauthConns, cfg.MaxConns, cfg.MaxConnsPerKey, cfg.MaxConnsPerUID), warn: newBurstLog(log, refusalLogEvery)}
	for _, ln := range cfg.Listeners {
		f.lns = append(f.lns, listener{ln: ln})
	}
	defer func() {
		if err != nil {
			f.CloseListeners()
		}
	}()
	if err := cfg.checkLimits(); err != nil {
		return nil, err
	}
	if cfg.AuthorizedKeys == "" {
		return nil, errors.New("ssh: no authorized-keys file (--ssh-authorized-keys)")
	}
	if len(cfg.Listen) == 0 && len(cfg.Listeners) == 0 {
		return nil, errors.New("ssh: no address to listen on (--ssh-listen)")
	}
	// Addresses first: a refused one must not leave a host key behind.
	addrs, remote, err := listenaddr.ParseAll("ssh", cfg.Listen, cfg.Listeners)
	if err != nil {
		return nil, err
	}
	if len(remote) > 0 {
		if !cfg.AllowRemote {
			return nil, fmt.Errorf("ssh: refusing to listen on %s, which is not a loopback address: the keys would be the only barrier against the network (pass --ssh-allow-remote to accept that)", strings.Join(remote, ", "))
		}
		log.Warn("RELAXATION: the SSH front door listens on non-loopback addresses (--ssh-allow-remote): anyone who reaches them with a listed key runs commands", "addrs", remote)
	}

	keys, err := sshkeys.Load(cfg.AuthorizedKeys)
	if err != nil {
		return nil, fmt.Errorf("ssh: %w", err)
	}
	if errs := checkKeyProfiles(keys, pol); len(errs) > 0 {
		return nil, fmt.Errorf("ssh: %w", errors.Join(errs...))
	}
	if keys.Len() == 0 {
		log.Warn("the authorized-keys file lists no key: nobody can log in", "file", cfg.AuthorizedKeys)
	}
	f.keys.Store(keys)
	signer, created, err := sshkeys.LoadOrCreateHostKey(cfg.HostKey)
	if err != nil {
		return nil, fmt.Errorf("ssh: %w", err)
	}
	if created {
		log.Info("created the SSH host key; clients pin its public half", "file", cfg.HostKey, "pub", cfg.HostKey+".pub")
	}
	f.hostFP = ssh.FingerprintSHA256(signer.PublicKey())
	f.config = &ssh.ServerConfig{
		// Public keys only: no PasswordCallback or
		// KeyboardInteractiveCallback, so those methods are not offered.
		PublicKeyCallback: f.checkKey,
		MaxAuthTries:      6,
		ServerVersion:     "SSH-2.0-vmgated",
	}
	f.config.AddHostKey(signer)

	for _, la := range addrs {
		ln, err := la.Listen(core.ListenUnix)
		if err != nil {
			return nil, fmt.Errorf("ssh: %w", err)
		}
		l := listener{ln: ln}
		if la.Network == "unix" {
			l.unix = la.Addr
		}
		f.lns = append(f.lns, l)
	}
	return f, nil
}

// checkKeyProfiles reports the keys whose profile pol does not give them.
func checkKeyProfiles(keys *sshkeys.Set, pol *policy.Policy) []error {
	var errs []error
	for _, e := range keys.Entries() {
		if err := pol.CheckKeyProfile(e.Profile); err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: key %s: %w", keys.Source(), e.Line, e.Fingerprint, err))
		}
	}
	return errs
}

// Reload reads the authorized-keys file again (SIGHUP). A file that does
// not parse keeps the old keys; keys whose profile the policy no longer
// gives them are logged (their requests are denied with the reason).
func (f *Front) Reload(pol *policy.Policy) {
	keys, err := sshkeys.Load(f.cfg.AuthorizedKeys)
	if err != nil {
		f.log.Error("authorized keys reload failed, keeping the old keys", "err", err)
		_ = f.core.Audit(audit.Record{Kind: audit.KindDaemon, Message: "ssh authorized keys reload failed", Error: err.Error()})
		return
	}
	for _, err := range checkKeyProfiles(keys, pol) {
		f.log.Warn("authorized key cannot get its profile; its requests will be denied", "err", err)
	}
	f.keys.Store(keys)
	f.log.Info("authorized keys reloaded", "file", keys.Source(), "keys", keys.Len())
	_ = f.core.Audit(audit.Record{Kind: audit.KindDaemon, Message: fmt.Sprintf("ssh authorized keys reloaded: %s (%d keys)", keys.Source(), keys.Len())})
}

// Permission extensions that carry the authenticated key's entry from
// checkKey to the connection. package ssh hands the connection the
// Permissions of the key the client actually proved it holds (not of the
// last key it merely offered: CVE-2024-45337, fixed in x/crypto 0.31), so
// the identity is taken from there and nowhere else.
const (
	extFingerprint = "vmgate-fingerprint"
	extProfile     = "vmgate-profile"
	extComment     = "vmgate-comment"
	extNoPTY       = "vmgate-no-pty"
)

func (f *Front) checkKey(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	e := f.keys.Load().Lookup(key)
	if e == nil {
		f.log.Debug("ssh key not authorized", "remote", meta.RemoteAddr().String(), "key", ssh.FingerprintSHA256(key))
		return nil, errors.New("key not authorized")
	}
	ext := map[string]string{extFingerprint: e.Fingerprint, extProfile: e.Profile, extComment: e.Comment}
	if e.NoPTY {
		ext[extNoPTY] = "1"
	}
	return &ssh.Permissions{Extensions: ext}, nil
}

// LogReady logs where the front door listens and with which keys.
func (f *Front) LogReady() {
	f.log.Info("SSH front door ready", "listen", f.Addrs(), "host_key", f.cfg.HostKey+".pub",
		"host_key_fingerprint", f.hostFP, "authorized_keys", f.cfg.AuthorizedKeys, "keys", f.keys.Load().Len())
}

// Addrs lists what the front door listens on, for the log.
func (f *Front) Addrs() []string {
	var out []string
	for _, l := range f.lns {
		if l.unix != "" {
			out = append(out, "unix:"+l.unix)
		} else {
			out = append(out, l.ln.Addr().String())
		}
	}
	return out
}

// Serve starts an accept loop per listener.
func (f *Front) Serve() {
	for _, l := range f.lns {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.acceptLoop(l)
		}()
	}
}

// refusalLogEvery is how often one kind of refusal is logged at most
// (burstLog).
const refusalLogEvery = time.Minute

// admitBatch bounds the connections accepted and not yet counted in the
// budget: those admitLoop identifies together with one read of the TCP
// socket tables. Beyond it, new connections wait in the kernel's backlog.
const admitBatch = 64

// acceptLoop accepts connections and hands them to admitLoop, which
// identifies and counts them.
func (f *Front) acceptLoop(l listener) {
	queue := make(chan net.Conn, admitBatch)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.admitLoop(l, queue)
	}()
	defer close(queue)
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			f.log.Warn("ssh accept", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		queue <- c
	}
}

// admitLoop takes the connections acceptLoop accepted, those waiting
// together as one batch, identifies the batch's peers (one read of the
// TCP socket tables for all of its loopback connections) and opens each
// in the budget, in the order they were accepted.
func (f *Front) admitLoop(l listener, queue <-chan net.Conn) {
	for c := range queue {
		batch := []net.Conn{c}
	more:
		for len(batch) < admitBatch {
			select {
			case c, ok := <-queue:
				if !ok {
					break more
				}
				batch = append(batch, c)
			default:
				break more
			}
		}
		peers := f.peersOf(batch)
		for i, c := range batch {
			f.open(l, c, peers[i])
		}
	}
}

// identified is a connection's peer, or why it cannot be told.
type identified struct {
	p   peer
	err error
}

// peersOf is who each connection of batch comes from: its uid where the
// kernel tells it (SO_PEERCRED on a unix: listener; on loopback TCP the
// owner of the client's socket, all of the batch's from one read of the
// socket tables), counted as its caller (Config.CallerOf); else its IP.
func (f *Front) peersOf(batch []net.Conn) []identified {
	out := make([]identified, len(batch))
	var local []tcpConn
	for i, c := range batch {
		if uc, ok := c.(*net.UnixConn); ok {
			uid, err := peerUID(uc)
			if err != nil {
				out[i].err = err
				continue
			}
			out[i].p, out[i].err = f.uidPeer(uid, true)
			continue
		}
		out[i].p = addrPeer(c)
		if tc, ok := loopbackTCP(c); ok {
			local = append(local, tc)
		}
	}
	if len(local) == 0 {
		return out
	}
	owners, err := tcpOwners(f.procNet, local)
	if err != nil {
		f.warn.warn("tcp owners", "cannot tell which uid owns local SSH clients' sockets: they are grouped by IP address", "err", err)
	}
	for i, c := range batch {
		tc, ok := loopbackTCP(c)
		if !ok {
			continue
		}
		if uid, ok := owners[tc]; ok {
			out[i].p, out[i].err = f.uidPeer(uid, false)
		}
	}
	return out
}

// addrPeer is the peer of a connection whose uid is not known: its
// remote IP over TCP (not its port: every connection has its own).
func addrPeer(c net.Conn) peer {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return peer{group: ta.IP.String()}
	}
	return peer{group: c.RemoteAddr().String()}
}

// loopbackTCP is c as its client's socket lists it, when c is a TCP
// connection from a loopback address: its client is then in the daemon's
// network namespace, and in its socket tables.
func loopbackTCP(c net.Conn) (tcpConn, bool) {
	ra, ok1 := c.RemoteAddr().(*net.TCPAddr)
	la, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return tcpConn{}, false
	}
	client, server := ra.AddrPort(), la.AddrPort()
	client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
	server = netip.AddrPortFrom(server.Addr().Unmap(), server.Port())
	if !client.Addr().IsLoopback() {
		return tcpConn{}, false
	}
	return tcpConn{client: client, server: server}, true
}

// uidPeer is the peer of a process that ran as uid: grouped, and counted
// against MaxConnsPerUID when capped, as the caller Config.CallerOf
// counts it as.
func (f *Front) uidPeer(uid uint32, capped bool) (peer, error) {
	caller := uid
	if f.cfg.CallerOf != nil {
		var err error
		if caller, err = f.cfg.CallerOf(uid); err != nil {
			return peer{}, err
		}
	}
	return peer{group: fmt.Sprintf("uid %d", caller), uid: caller, ranAs: uid, hasUID: true, capped: capped}, nil
}

// open counts a connection in the budget and serves it, or closes it:
// when its peer cannot be told, or its uid holds MaxConnsPerUID.
func (f *Front) open(l listener, c net.Conn, id identified) {
	remote := c.RemoteAddr().String()
	if l.unix != "" {
		remote = "unix:" + l.unix
	} else if _, ok := c.(*net.UnixConn); ok {
		remote = "unix:" + l.ln.Addr().String()
	}
	p := id.p
	if id.err != nil {
		// Fail closed: a peer that cannot be told cannot be bounded.
		f.warn.warn("peercred", "cannot tell who an SSH client is, closing its connection", "remote", remote, "err", id.err)
		c.Close()
		return
	}
	if !f.track(c) {
		c.Close()
		return
	}
	t, displaced, lim := f.budget.open(p, c)
	if lim == limitUID {
		args := []any{"uid", p.uid}
		if p.ranAs != p.uid {
			args = append(args, "ran_as", p.ranAs)
		}
		f.warn.warn(p.group, "too many SSH connections from one uid, closing new ones", append(args, "max", f.cfg.MaxConnsPerUID, "remote", remote)...)
		f.untrack(c)
		c.Close()
		return
	}
	if displaced != nil {
		f.warn.warn("pending", "too many SSH connections not yet authenticated, closing the oldest of the peer with the most",
			"max", f.cfg.MaxUnauthConns, "closed_peer", displaced.peer.group, "new_peer", p.group)
		_ = displaced.closer.Close()
	}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer f.budget.done(t)
		defer f.untrack(c)
		defer c.Close()
		f.serveConn(c, t, remote)
	}()
}

func (f *Front) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Front) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// CloseListeners stops accepting (shutdown starts) and removes the Unix
// sockets the front door created.
func (f *Front) CloseListeners() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	for _, l := range f.lns {
		_ = l.ln.Close()
		if l.unix != "" {
			_ = os.Remove(l.unix)
		}
	}
}

// CloseConns drops every connection (after the commands ended or were
// killed) and waits for their goroutines.
func (f *Front) CloseConns() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// connState is one authenticated connection: its open sessions and the
// timer that closes it once it has had none for IdleTimeout.
//
// A session holds its slot from its channel's open until its command's
// output is written: it gives the slot back before it tells the client
// that the command ended (EOF, exit-status or exit-signal, close), so that
// a client running commands back to back finds the slot free when it
// opens the next session. What the session still sends then (EOF, the
// exit status, close) is outside the channel's window, so a client that
// stops reading cannot hold it there; if it stops reading the connection
// altogether, every session of it, the new ones in their channel's
// acceptance, waits on the connection, and the new ones hold their slots.
// A session the client closes first gives its slot back when it has
// ended (its command killed).
type connState struct {
	mu     sync.Mutex
	active int
	idle   *time.Timer
}

func (sc *connState) acquire(max int) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.active >= max {
		return false
	}
	sc.active++
	sc.idle.Stop()
	return true
}

func (sc *connState) release(idle time.Duration) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.active--
	if sc.active == 0 {
		sc.idle.Reset(idle)
	}
}

// serveConn serves a connection t counts: the handshake and
// authentication within HandshakeTimeout of accept, then admission
// (refused over MaxConns or MaxConnsPerKey), then its sessions.
func (f *Front) serveConn(c net.Conn, t *tracked, remote string) {
	_ = c.SetDeadline(time.Now().Add(f.cfg.HandshakeTimeout))
	conn, chans, reqs, err := ssh.NewServerConn(c, f.config)
	if err != nil {
		// Unauthenticated peers choose how often this happens.
		f.log.Debug("ssh handshake failed", "remote", remote, "err", err)
		f.warn.log(slog.LevelInfo, "handshake", "ssh handshake failed", "remote", remote, "err", err)
		return
	}
	defer conn.Close()
	ext := conn.Permissions.Extensions
	if lim := f.budget.admit(t, ext[extFingerprint]); lim != limitNone {
		f.refuseConn(lim, ext[extFingerprint], remote, chans, reqs)
		return
	}
	_ = c.SetDeadline(time.Time{})
	id := policy.Identity{SSH: &policy.SSHKey{Profile: ext[extProfile], Fingerprint: ext[extFingerprint], Comment: ext[extComment],
		User: truncate(conn.User(), 64), RemoteAddr: remote}}
	noPTY := ext[extNoPTY] != ""
	var lg login
	lg.session, lg.err = SessionFromLogin(conn.User())
	log := f.log.With("remote", remote, "key", id.SSH.Fingerprint)
	if t.peer.hasUID {
		log = log.With("peer_uid", t.peer.uid)
		if t.peer.ranAs != t.peer.uid {
			log = log.With("peer_ran_as", t.peer.ranAs)
		}
	}
	log.Info("ssh connection", "user", id.SSH.User, "comment", id.SSH.Comment, "profile", id.SSH.Profile)
	go ssh.DiscardRequests(reqs)

	sc := &connState{idle: time.AfterFunc(f.cfg.IdleTimeout, func() {
		log.Info("closing an idle SSH connection", "idle", f.cfg.IdleTimeout)
		conn.Close()
	})}
	defer sc.idle.Stop()
	var chWG sync.WaitGroup
	defer chWG.Wait()
	for nc := range chans {
		if nc.ChannelType() != "session" {
			_ = nc.Reject(ssh.UnknownChannelType, "vmgated serves session channels only (no forwarding)")
			continue
		}
		if !sc.acquire(f.cfg.MaxSessions) {
			_ = nc.Reject(ssh.ResourceShortage, fmt.Sprintf("too many sessions on this connection (at most %d)", f.cfg.MaxSessions))
			continue
		}
		var once sync.Once
		release := func() { once.Do(func() { sc.release(f.cfg.IdleTimeout) }) }
		chWG.Add(1)
		go func() {
			defer chWG.Done()
			defer release()
			f.serveChannel(log, id, lg, noPTY, nc, release)
		}()
	}
	log.Debug("ssh connection closed")
}

// refuseConn serves an authenticated connection that was not admitted:
// it rejects its session channels with the reason until the client goes
// or HandshakeTimeout (still counted from accept) ends it. It stays in
// the pending budget meanwhile.
func (f *Front) refuseConn(lim limit, key, remote string, chans <-chan ssh.NewChannel, reqs <-chan *ssh.Request) {
	switch lim {
	case limitPending:
		return // displaced or closed after its handshake
	case limitKey:
		f.warn.warn("key "+key, "too many SSH connections with one key, refusing the sessions of new ones", "key", key, "max", f.cfg.MaxConnsPerKey, "remote", remote)
	default:
		f.warn.warn("conns", "too many authenticated SSH connections, refusing the sessions of new ones", "max", f.cfg.MaxConns, "key", key, "remote", remote)
	}
	reason := f.budget.refusalMessage(lim, key)
	go ssh.DiscardRequests(reqs)
	for nc := range chans {
		_ = nc.Reject(ssh.ResourceShortage, reason)
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
