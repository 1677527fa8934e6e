package gateway

import (
	"context"
	"errors"
	"fmt"
	"github.com/vmgate/vmgate/internal/sshmsg"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/sshkeys"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// SSHConfig configures the SSH front door (see the package doc). The zero
// values of the limits get the documented defaults.
type SSHConfig struct {
	// Listen holds the addresses to serve: "127.0.0.1:2222", "[::1]:2222"
	// or "unix:/run/vmgate/ssh.sock". A TCP address must be an IP literal,
	// and a loopback one unless AllowRemote is set.
	Listen []string
	// Listeners are open listeners to serve as well (tests, embedding);
	// TCP ones are checked like Listen. They are closed at shutdown.
	Listeners []net.Listener
	// AllowRemote permits non-loopback TCP addresses: a logged relaxation.
	AllowRemote bool
	// HostKey is the host key file (default STATE/ssh_host_ed25519_key),
	// created (ed25519, mode 0600, with HostKey.pub) when missing.
	HostKey string
	// AuthorizedKeys is the authorized-keys file (package sshkeys); required.
	AuthorizedKeys string
	// MaxSessions bounds the session channels one connection may have
	// open at once (default 4); each running command holds one.
	MaxSessions int
	// MaxConns bounds connections, authenticated or not (default 64).
	MaxConns int
	// IdleTimeout closes a connection that has had no session for this
	// long (default 10m).
	IdleTimeout time.Duration
	// HandshakeTimeout bounds the SSH handshake and authentication, and
	// the time from opening a session to asking for a command or shell
	// (default 20s).
	HandshakeTimeout time.Duration
}

// DefaultSSHHostKey is the host key's file name under the state directory.
const DefaultSSHHostKey = "ssh_host_ed25519_key"

// InteractiveShell is what an SSH session without a command runs: the
// guest's login shell (Debian's bash), decided on and audited as this argv
// with policy.Request.Interactive set.
var InteractiveShell = []string{"bash", "-l"}

func (c *SSHConfig) setDefaults(stateDir string) {
	if c.HostKey == "" {
		c.HostKey = filepath.Join(stateDir, DefaultSSHHostKey)
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 4
	}
	if c.MaxConns == 0 {
		c.MaxConns = 64
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 20 * time.Second
	}
}

// sshListenAddr is a parsed --ssh-listen address.
type sshListenAddr struct {
	network, addr string
	loopback      bool // always true for unix sockets
}

// parseSSHListen parses "unix:/abs/path" or "IP:PORT" ("[IPv6]:PORT").
func parseSSHListen(s string) (sshListenAddr, error) {
	if p, ok := strings.CutPrefix(s, "unix:"); ok {
		switch {
		case !filepath.IsAbs(p) || filepath.Clean(p) != p:
			return sshListenAddr{}, fmt.Errorf("ssh listen %q: want unix:/ABSOLUTE/CLEAN/PATH", s)
		case len(p) >= 108:
			return sshListenAddr{}, fmt.Errorf("ssh listen %q: socket path too long (max 107 bytes)", s)
		}
		return sshListenAddr{network: "unix", addr: p, loopback: true}, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return sshListenAddr{}, fmt.Errorf("ssh listen %q: want IP:PORT or unix:/PATH: %w", s, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || strconv.FormatUint(n, 10) != port {
		return sshListenAddr{}, fmt.Errorf("ssh listen %q: port %q: want a number 0 to 65535", s, port)
	}
	if host == "" {
		return sshListenAddr{}, fmt.Errorf("ssh listen %q: no address: give one, e.g. 127.0.0.1:%s (0.0.0.0 for every interface, with --ssh-allow-remote)", s, port)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return sshListenAddr{}, fmt.Errorf("ssh listen %q: %q is not an IP address without zone: use 127.0.0.1 or ::1, not a host name", s, host)
	}
	ip = ip.Unmap()
	return sshListenAddr{network: "tcp", addr: netip.AddrPortFrom(ip, uint16(mustAtoi(port))).String(), loopback: ip.IsLoopback()}, nil
}

func mustAtoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// sshFront is the SSH front door: its listeners, its connections and the
// authorized keys (replaced on SIGHUP).
type sshFront struct {
	s      *Server
	cfg    SSHConfig
	log    *slog.Logger
	config *ssh.ServerConfig
	keys   atomic.Pointer[sshkeys.Set]
	lns    []sshListener
	sem    chan struct{} // one token per connection
	hostFP string        // the host key's fingerprint

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup // accept loops and connections
}

type sshListener struct {
	ln   net.Listener
	unix string // socket path to remove at shutdown; "" for TCP
}

// newSSHFront loads the keys and the host key, checks the keys against
// pol, and opens the listeners. Nothing is served until serve.
func newSSHFront(s *Server, cfg SSHConfig, pol *policy.Policy, log *slog.Logger) (_ *sshFront, err error) {
	cfg.setDefaults(s.cfg.StateDir)
	log = log.With("front", "ssh")
	f := &sshFront{s: s, cfg: cfg, log: log, sem: make(chan struct{}, cfg.MaxConns), conns: map[net.Conn]struct{}{}}
	for _, ln := range cfg.Listeners {
		f.lns = append(f.lns, sshListener{ln: ln})
	}
	defer func() {
		if err != nil {
			f.closeListeners()
		}
	}()
	if cfg.AuthorizedKeys == "" {
		return nil, errors.New("ssh: no authorized-keys file (--ssh-authorized-keys)")
	}
	if len(cfg.Listen) == 0 && len(cfg.Listeners) == 0 {
		return nil, errors.New("ssh: no address to listen on (--ssh-listen)")
	}
	// Addresses first: a refused one must not leave a host key behind.
	var addrs []sshListenAddr
	var remote []string
	for _, a := range cfg.Listen {
		la, err := parseSSHListen(a)
		if err != nil {
			return nil, err
		}
		if !la.loopback {
			remote = append(remote, la.addr)
		}
		addrs = append(addrs, la)
	}
	for _, ln := range cfg.Listeners {
		if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsLoopback() {
			remote = append(remote, ta.String())
		}
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
		var ln net.Listener
		if la.network == "unix" {
			ln, err = listenUnix(la.addr, s.cfg.SocketMode, s.cfg.SocketGroup, log)
		} else {
			ln, err = net.Listen("tcp", la.addr)
		}
		if err != nil {
			return nil, fmt.Errorf("ssh: %w", err)
		}
		l := sshListener{ln: ln}
		if la.network == "unix" {
			l.unix = la.addr
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

// reload reads the authorized-keys file again (SIGHUP). A file that does
// not parse keeps the old keys; keys whose profile the policy no longer
// gives them are logged (their requests are denied with the reason).
func (f *sshFront) reload(pol *policy.Policy) {
	keys, err := sshkeys.Load(f.cfg.AuthorizedKeys)
	if err != nil {
		f.log.Error("authorized keys reload failed, keeping the old keys", "err", err)
		_ = f.s.audit.Write(audit.Record{Kind: audit.KindDaemon, Message: "ssh authorized keys reload failed", Error: err.Error()})
		return
	}
	for _, err := range checkKeyProfiles(keys, pol) {
		f.log.Warn("authorized key cannot get its profile; its requests will be denied", "err", err)
	}
	f.keys.Store(keys)
	f.log.Info("authorized keys reloaded", "file", keys.Source(), "keys", keys.Len())
	_ = f.s.audit.Write(audit.Record{Kind: audit.KindDaemon, Message: fmt.Sprintf("ssh authorized keys reloaded: %s (%d keys)", keys.Source(), keys.Len())})
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

func (f *sshFront) checkKey(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
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

// addrs lists what the front door listens on, for the log.
func (f *sshFront) addrs() []string {
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

// serve starts an accept loop per listener.
func (f *sshFront) serve() {
	for _, l := range f.lns {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.acceptLoop(l)
		}()
	}
}

func (f *sshFront) acceptLoop(l sshListener) {
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
		select {
		case f.sem <- struct{}{}:
		default:
			f.log.Warn("too many SSH connections, refusing one", "max", f.cfg.MaxConns, "remote", c.RemoteAddr().String())
			c.Close()
			continue
		}
		if !f.track(c) {
			<-f.sem
			c.Close()
			return
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() { <-f.sem }()
			defer f.untrack(c)
			defer c.Close()
			remote := c.RemoteAddr().String()
			if l.unix != "" {
				remote = "unix:" + l.unix
			}
			f.serveConn(c, remote)
		}()
	}
}

func (f *sshFront) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *sshFront) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// closeListeners stops accepting (shutdown starts) and removes the Unix
// sockets the front door created.
func (f *sshFront) closeListeners() {
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

// closeConns drops every connection (after the commands ended or were
// killed) and waits for their goroutines.
func (f *sshFront) closeConns() {
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// sshConn is one authenticated connection: its open sessions and the
// timer that closes it once it has had none for IdleTimeout.
type sshConn struct {
	mu     sync.Mutex
	active int
	idle   *time.Timer
}

func (sc *sshConn) acquire(max int) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.active >= max {
		return false
	}
	sc.active++
	sc.idle.Stop()
	return true
}

func (sc *sshConn) release(idle time.Duration) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	sc.active--
	if sc.active == 0 {
		sc.idle.Reset(idle)
	}
}

func (f *sshFront) serveConn(c net.Conn, remote string) {
	_ = c.SetDeadline(time.Now().Add(f.cfg.HandshakeTimeout))
	conn, chans, reqs, err := ssh.NewServerConn(c, f.config)
	if err != nil {
		f.log.Info("ssh handshake failed", "remote", remote, "err", err)
		return
	}
	defer conn.Close()
	_ = c.SetDeadline(time.Time{})
	ext := conn.Permissions.Extensions
	id := policy.Identity{SSH: &policy.SSHKey{Profile: ext[extProfile], Fingerprint: ext[extFingerprint], Comment: ext[extComment],
		User: truncate(conn.User(), 64), RemoteAddr: remote}}
	noPTY := ext[extNoPTY] != ""
	log := f.log.With("remote", remote, "key", id.SSH.Fingerprint)
	log.Info("ssh connection", "user", id.SSH.User, "comment", id.SSH.Comment, "profile", id.SSH.Profile)
	go ssh.DiscardRequests(reqs)

	sc := &sshConn{idle: time.AfterFunc(f.cfg.IdleTimeout, func() {
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
		chWG.Add(1)
		go func() {
			defer chWG.Done()
			defer sc.release(f.cfg.IdleTimeout)
			f.serveChannel(log, id, noPTY, nc)
		}()
	}
	log.Debug("ssh connection closed")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// sshJob is what a session channel asked for once it sends "exec" or
// "shell".
type sshJob struct {
	command     string // for exec
	interactive bool   // shell
	env         []string
	tty         *wire.TTY
}

// serveChannel serves one session channel: an sshSession collects env
// and pty-req requests, then the exec or shell request starts the command
// through admit and runExec (run), whose outcome is reported as
// exit-status or exit-signal. The command is killed (and its VM
// destroyed) when the channel or connection closes.
func (f *sshFront) serveChannel(log *slog.Logger, id policy.Identity, noPTY bool, nc ssh.NewChannel) {
	ch, reqs, err := nc.Accept()
	if err != nil {
		return
	}
	defer ch.Close()
	ss := &sshSession{f: f, log: log, id: id, noPTY: noPTY, envSeen: map[string]bool{},
		startc: make(chan sshJob, 1), signals: make(chan string, 8), resize: make(chan vm.PTY, 1)}
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		for r := range reqs {
			ss.handle(r)
		}
	}()
	select {
	case job := <-ss.startc:
		f.run(log, id, ch, job, ss.signals, ss.resize, gone)
	case <-gone:
	case <-time.After(f.cfg.HandshakeTimeout):
		log.Info("ssh session asked for no command or shell in time, closing it", "timeout", f.cfg.HandshakeTimeout)
	}
}

// sshSession is one session channel's requests, in the order RFC 4254
// gives them (as the guest agent's session takes them): env, pty-req and
// window-change set the command up; exec or shell starts it; then signal
// and window-change reach the running command. Requests arrive on one
// goroutine; what reaches the command goes through channels.
type sshSession struct {
	f     *sshFront
	log   *slog.Logger
	id    policy.Identity
	noPTY bool // the key's no-pty option

	job     sshJob
	envSeen map[string]bool
	started bool

	startc  chan sshJob // the job, once
	signals chan string // RFC 4254 signal names for the command
	resize  chan vm.PTY // the latest terminal size for the command
}

// handle answers one channel request.
func (ss *sshSession) handle(r *ssh.Request) {
	ok := false
	switch r.Type {
	case sshmsg.Env:
		ok = ss.env(r.Payload)
	case sshmsg.PtyReq:
		ok = ss.pty(r.Payload)
	case sshmsg.WindowChange:
		ok = ss.windowChange(r.Payload)
	case sshmsg.Exec, sshmsg.Shell:
		if ss.start(r) {
			return // replied already
		}
	case sshmsg.Signal:
		ok = ss.signal(r.Payload)
	}
	if r.WantReply {
		_ = r.Reply(ok, nil)
	}
}

// env passes a variable the profile allows, before the command starts.
func (ss *sshSession) env(payload []byte) bool {
	var p sshmsg.EnvRequest
	switch {
	case ss.started || ssh.Unmarshal(payload, &p) != nil:
		return false
	case ss.envSeen[p.Name] || len(ss.job.env) >= policy.MaxEnv || len(p.Name)+len(p.Value) >= policy.MaxArgBytes ||
		strings.ContainsRune(p.Name+p.Value, 0):
		return false
	case !ss.f.s.policy.Load().AllowsEnv(ss.id, p.Name):
		ss.log.Debug("ssh env variable not passed: the profile does not allow it", "name", truncate(p.Name, 64))
		return false
	}
	ss.envSeen[p.Name] = true
	ss.job.env = append(ss.job.env, p.Name+"="+p.Value)
	return true
}

// pty asks for a terminal, before the command starts, unless the key
// forbids it.
func (ss *sshSession) pty(payload []byte) bool {
	var p sshmsg.PtyRequest
	if ss.started || ss.noPTY || ssh.Unmarshal(payload, &p) != nil || !sshmsg.TermSizeOK(p.Columns, p.Rows) || !sshmsg.TermNameOK(p.Term) {
		return false
	}
	ss.job.tty = &wire.TTY{Term: p.Term, Cols: p.Columns, Rows: p.Rows}
	return true
}

// windowChange sets the terminal's size: before the command starts, the
// pty's; after, the latest size goes to the running command (a size not
// yet taken is replaced).
func (ss *sshSession) windowChange(payload []byte) bool {
	var p sshmsg.WindowChangeRequest
	if ss.job.tty == nil || ssh.Unmarshal(payload, &p) != nil || p.Columns == 0 || p.Rows == 0 || !sshmsg.TermSizeOK(p.Columns, p.Rows) {
		return false
	}
	if !ss.started {
		ss.job.tty.Cols, ss.job.tty.Rows = p.Columns, p.Rows
		return true
	}
	sz := vm.PTY{Columns: p.Columns, Rows: p.Rows}
	select {
	case ss.resize <- sz:
	default:
		select {
		case <-ss.resize:
		default:
		}
		select {
		case ss.resize <- sz:
		default:
		}
	}
	return true
}

// start takes the exec or shell request: the first one starts the job,
// replied to before the command can send anything. It reports whether it
// replied.
func (ss *sshSession) start(r *ssh.Request) bool {
	if ss.started {
		return false
	}
	if r.Type == sshmsg.Exec {
		var p sshmsg.ExecRequest
		if ssh.Unmarshal(r.Payload, &p) != nil {
			return false
		}
		ss.job.command = p.Command
	} else {
		ss.job.interactive = true
	}
	ss.started = true
	if r.WantReply {
		_ = r.Reply(true, nil)
	}
	ss.startc <- ss.job
	return true
}

// signal passes a signal to the running command (dropped when 8 wait).
func (ss *sshSession) signal(payload []byte) bool {
	var p sshmsg.SignalRequest
	if !ss.started || ssh.Unmarshal(payload, &p) != nil {
		return false
	}
	select {
	case ss.signals <- strings.TrimPrefix(p.Signal, "SIG"):
		return true
	default:
		return false
	}
}

// run runs a session channel's command or shell and reports its outcome.
func (f *sshFront) run(log *slog.Logger, id policy.Identity, ch ssh.Channel, job sshJob, signals chan string, resize chan vm.PTY, gone <-chan struct{}) {
	req := &wire.ExecRequest{Env: job.env, Stdin: true, TTY: job.tty}
	if job.interactive {
		req.Argv = append([]string(nil), InteractiveShell...)
	} else {
		req.Argv, req.Shell = []string{job.command}, true
	}
	nl := "\n"
	if job.tty != nil {
		nl = "\r\n" // the client's terminal is in raw mode
	}
	fail := func(code int, msg string) {
		_, _ = io.WriteString(ch.Stderr(), "vmgate: "+msg+nl)
		_ = ch.CloseWrite()
		_, _ = ch.SendRequest(sshmsg.ExitStatus, false, ssh.Marshal(sshmsg.ExitStatusMsg{Status: uint32(code)}))
	}
	if strings.ContainsRune(job.command, 0) {
		fail(wire.ExitInternal, "the command contains a NUL byte")
		return
	}
	if !f.s.begin() {
		fail(wire.ExitInternal, "vmgated is shutting down")
		return
	}
	defer f.s.end()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer context.AfterFunc(f.s.execCtx, cancel)()
	go func() {
		select {
		case <-gone:
			cancel() // the client closed the channel or the connection dropped
		case <-ctx.Done():
		}
	}()
	st := newExecState(id, req, job.interactive)
	log = log.With("req", st.reqID)
	target, rerr := f.s.admit(ctx, log, st)
	if rerr != nil {
		code, msg := sshRefusal(rerr.Wire())
		fail(code, msg)
		return
	}
	sio := execIO{stdin: ch, stdout: ch, stderr: ch.Stderr(), signals: signals, resize: resize, gone: gone}
	var idled atomic.Bool
	if job.interactive {
		a := &activity{}
		a.touch()
		sio.stdin = &activityReader{r: ch, a: a}
		sio.stdout = &activityWriter{w: ch, a: a}
		sio.stderr = &activityWriter{w: ch.Stderr(), a: a}
		go a.watch(ctx, st.verdict.Limits.SessionIdle, func() {
			idled.Store(true)
			log.Info("interactive shell idle, ending it", "idle", st.verdict.Limits.SessionIdle)
			cancel()
		})
	}
	res, err := f.s.runExec(ctx, log, st, target, sio)
	switch {
	case idled.Load():
		fail(wire.ExitTimedOut, fmt.Sprintf("no input or output for %v (the profile's sessions.idle_timeout); the shell was ended", st.verdict.Limits.SessionIdle))
	case err != nil:
		select {
		case <-gone:
			return // nobody to tell
		default:
		}
		if f.s.execCtx.Err() != nil {
			fail(wire.ExitVMFailed, fmt.Sprintf("vmgated is shutting down and killed the command (request %s)", st.reqID))
			return
		}
		fail(wire.ExitVMFailed, fmt.Sprintf("the command's outcome is unknown: %v (request %s)", err, st.reqID))
	case res.TimedOut:
		fail(wire.ExitTimedOut, fmt.Sprintf("timed out after %v; the command was killed (request %s)", st.verdict.Limits.Timeout, st.reqID))
	default:
		if res.StdoutTruncated || res.StderrTruncated {
			_, _ = fmt.Fprintf(ch.Stderr(), "vmgate: output truncated by the policy's output limit (stdout %d bytes, stderr %d bytes produced)%s", res.StdoutBytes, res.StderrBytes, nl)
		}
		_ = ch.CloseWrite()
		if res.Signal != "" {
			_, _ = ch.SendRequest(sshmsg.ExitSignal, false, ssh.Marshal(sshmsg.ExitSignalMsg{Signal: res.Signal}))
		} else {
			_, _ = ch.SendRequest(sshmsg.ExitStatus, false, ssh.Marshal(sshmsg.ExitStatusMsg{Status: uint32(res.ExitCode)}))
		}
	}
}

// sshRefusal maps a refusal to the message an SSH client gets on stderr
// and the exit status, with vm-exec's codes (wire.Error.ExitCode).
func sshRefusal(e wire.Error) (int, string) {
	msg := e.Message()
	if e.RequestID != "" {
		msg += " (request " + e.RequestID + ")"
	}
	return e.ExitCode(), msg
}

// activity is the time of the last traffic of an interactive shell.
type activity struct{ last atomic.Int64 }

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// watch calls idle once when there was no traffic for d; it returns when
// ctx ends.
func (a *activity) watch(ctx context.Context, d time.Duration, idle func()) {
	if d <= 0 {
		return
	}
	t := time.NewTicker(min(d/4, 5*time.Second) + time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if now.Sub(time.Unix(0, a.last.Load())) >= d {
				idle()
				return
			}
		}
	}
}

type activityReader struct {
	r io.Reader
	a *activity
}

func (r *activityReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if n > 0 {
		r.a.touch()
	}
	return n, err
}

type activityWriter struct {
	w io.Writer
	a *activity
}

func (w *activityWriter) Write(p []byte) (int, error) {
	w.a.touch()
	return w.w.Write(p)
}
