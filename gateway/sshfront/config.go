package sshfront

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmgate/vmgate/internal/names"
)

// Config configures the SSH front door (see the package doc). The zero
// values of the limits get the documented defaults.
type Config struct {
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
	// MaxConns bounds authenticated connections (default 64). A
	// connection authenticated over it has its sessions refused with the
	// reason, and is closed at HandshakeTimeout.
	MaxConns int
	// MaxUnauthConns bounds connections not yet admitted (handshake or
	// authentication under way), apart from MaxConns (default 16). When
	// all are taken, a new connection displaces the oldest pending one
	// of the peer that has the most (see limits.go), so that holding
	// connections open keeps no client out.
	MaxUnauthConns int
	// MaxConnsPerKey bounds one key's authenticated connections (default
	// a quarter of MaxConns, at least 1); over it, as over MaxConns.
	MaxConnsPerKey int
	// MaxConnsPerUID bounds one peer uid's connections on unix:
	// listeners, admitted or not (default half of MaxConns, at least 1);
	// a connection over it is closed at once.
	MaxConnsPerUID int
	// IdleTimeout closes a connection that has had no session for this
	// long (default 10m).
	IdleTimeout time.Duration
	// HandshakeTimeout bounds the time from accepting a connection to
	// admitting it (SSH handshake and authentication), and the time from
	// opening a session to asking for a command or shell (default 10s:
	// enough for a FIDO key's touch).
	HandshakeTimeout time.Duration
	// InteractiveShell is what a session without a command runs, decided
	// on and audited as this argv with policy.Request.Interactive set.
	// Empty (the default): the core runs the login shell of the image the
	// login's VM runs (bash -l, or sh -l in an imported root without
	// bash; image.Source.LoginShell).
	InteractiveShell []string
	// CallerOf, when set, is the uid a peer uid counts as: the daemon's
	// attribution of callers, which counts a subordinate uid (subuid(5))
	// as its login, so that a login's 65,536 subordinate uids share one
	// per-uid bound and one pending group, as on the local API. An error
	// (the uid's caller cannot be told) closes the connection at accept.
	// nil counts every uid as its own.
	CallerOf func(uid uint32) (uint32, error)
}

// DefaultHandshakeTimeout is Config.HandshakeTimeout's default.
const DefaultHandshakeTimeout = 10 * time.Second

// DefaultMaxUnauthConns is Config.MaxUnauthConns's default.
const DefaultMaxUnauthConns = 16

// DefaultHostKey is the host key's file name under the state directory.
const DefaultHostKey = "ssh_host_ed25519_key"

func (c *Config) setDefaults(stateDir string) {
	if c.HostKey == "" {
		c.HostKey = filepath.Join(stateDir, DefaultHostKey)
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = 4
	}
	if c.MaxConns == 0 {
		c.MaxConns = 64
	}
	if c.MaxUnauthConns == 0 {
		c.MaxUnauthConns = DefaultMaxUnauthConns
	}
	if c.MaxConnsPerKey == 0 {
		c.MaxConnsPerKey = max(1, c.MaxConns/4)
	}
	if c.MaxConnsPerUID == 0 {
		c.MaxConnsPerUID = max(1, c.MaxConns/2)
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 10 * time.Minute
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
}

// checkLimits refuses negative limits (setDefaults has replaced zeros).
func (c *Config) checkLimits() error {
	type count struct {
		name string
		n    int
	}
	for _, l := range []count{{"MaxSessions", c.MaxSessions}, {"MaxConns", c.MaxConns}, {"MaxUnauthConns", c.MaxUnauthConns},
		{"MaxConnsPerKey", c.MaxConnsPerKey}, {"MaxConnsPerUID", c.MaxConnsPerUID}} {
		if l.n < 1 {
			return fmt.Errorf("ssh: %s is %d: want 1 or more (0 for the default)", l.name, l.n)
		}
	}
	if c.IdleTimeout <= 0 || c.HandshakeTimeout <= 0 {
		return fmt.Errorf("ssh: IdleTimeout %v, HandshakeTimeout %v: want positive durations (0 for the default)", c.IdleTimeout, c.HandshakeTimeout)
	}
	return nil
}

// SessionLoginPrefix is the login name prefix that selects a session:
// ssh session-NAME@host runs every command of the connection in the key's
// session NAME (created on first use under the profile's session rules);
// any other login runs each command in a fresh VM.
const SessionLoginPrefix = "session-"

// SessionFromLogin is the session a login name selects: "" for a login
// without the prefix, or an error for a name that is not a session name
// (names.Session: characters llama-server allows in an SSH target), so
// that no session name carries anything but those.
func SessionFromLogin(user string) (string, error) {
	name, ok := strings.CutPrefix(user, SessionLoginPrefix)
	if !ok {
		return "", nil
	}
	if !names.Session(name) {
		return "", fmt.Errorf("login %q: a session name is %s", truncate(user, 80), names.SessionRule)
	}
	return name, nil
}
