package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/vm/agentproto"
)

// serverVersion is the SSH identification string the agent announces.
const serverVersion = "SSH-2.0-vmgate-agent"

// bootIDPath holds the kernel's random boot id.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// Config configures [Serve].
type Config struct {
	// HostKey is the agent's SSH host key. Required.
	HostKey ssh.Signer
	// AuthorizedKeys are the client keys allowed to log in as
	// agentproto.User. Required; every other key is rejected.
	AuthorizedKeys []ssh.PublicKey
	// Logger receives the agent's logs; nil means slog.Default().
	Logger *slog.Logger
	// Version is the agent version reported in agentproto.Info.
	Version string

	// setClock sets the system clock for SetTimeRequest; nil means
	// setSystemClock. Tests replace it so that they never touch the clock.
	setClock func(time.Time) error
	// reseed credits entropy and reseeds the kernel's generator; nil
	// means reseedKernel. Tests replace it.
	reseed func([]byte) error
	// netChecker answers NetReadyRequest; nil means the guest's own
	// network state. Tests replace it.
	netChecker *netChecker
}

// Serve serves one SSH connection on conn until the connection ends or ctx
// is done, then closes conn. Only public-key authentication as
// agentproto.User with one of cfg.AuthorizedKeys is accepted. Commands still
// running when the connection ends are killed, and Serve returns only after
// they have been reaped and all of its goroutines have finished.
//
// Serve returns nil when the client closed the connection, ctx.Err() when
// ctx ended it, and an error when the handshake failed or the connection
// broke.
func Serve(ctx context.Context, conn net.Conn, cfg Config) error {
	_, err := serve(ctx, conn, cfg)
	return err
}

// serve implements Serve and also reports whether the SSH handshake
// (including authentication) completed.
func serve(ctx context.Context, conn net.Conn, cfg Config) (handshakeDone bool, err error) {
	if err := cfg.validate(); err != nil {
		_ = conn.Close()
		return false, fmt.Errorf("serve: %w", err)
	}
	log := cfg.logger()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()

	sconn, chans, reqs, err := ssh.NewServerConn(conn, cfg.serverConfig(log))
	if err != nil {
		_ = conn.Close()
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, fmt.Errorf("ssh handshake: %w", err)
	}
	log = log.With("client", string(sconn.ClientVersion()))
	log.Debug("host connected")

	// connCtx ends with the connection, so that a request still waiting
	// (NetReadyRequest) does not outlive it.
	connCtx, endConn := context.WithCancel(ctx)
	defer endConn()
	s := &server{cfg: cfg, log: log, ctx: connCtx}
	var wg sync.WaitGroup
	wg.Go(func() { s.globalRequests(reqs) })
	for nc := range chans {
		s.openChannel(&wg, nc)
	}
	// chans is closed once the connection is gone; every channel has been
	// closed as well, so the sessions are killing and reaping their commands.
	_ = sconn.Close()
	connErr := sconn.Wait()
	endConn()
	wg.Wait()
	log.Debug("host disconnected")

	switch {
	case ctx.Err() != nil:
		return true, ctx.Err()
	case connErr == nil || errors.Is(connErr, io.EOF):
		return true, nil
	default:
		return true, fmt.Errorf("ssh connection: %w", connErr)
	}
}

func (c *Config) validate() error {
	if c.HostKey == nil {
		return errors.New("no host key")
	}
	if len(c.AuthorizedKeys) == 0 {
		return errors.New("no authorized keys")
	}
	return nil
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}

// serverConfig returns the SSH server configuration: public-key
// authentication as agentproto.User only.
func (c *Config) serverConfig(log *slog.Logger) *ssh.ServerConfig {
	authorized := make([][]byte, len(c.AuthorizedKeys))
	for i, k := range c.AuthorizedKeys {
		authorized[i] = k.Marshal()
	}
	sc := &ssh.ServerConfig{
		ServerVersion: serverVersion,
		PublicKeyCallback: func(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
			return nil, checkPublicKey(meta.User(), key, authorized)
		},
		AuthLogCallback: func(meta ssh.ConnMetadata, method string, err error) {
			if err != nil && method != "none" {
				log.Debug("authentication attempt rejected", "user", meta.User(), "method", method, "err", err)
			}
		},
	}
	sc.AddHostKey(c.HostKey)
	return sc
}

// checkPublicKey accepts key for user if user is agentproto.User and key is
// one of the marshalled authorized keys.
func checkPublicKey(user string, key ssh.PublicKey, authorized [][]byte) error {
	if user != agentproto.User {
		return fmt.Errorf("user %q is not allowed", user)
	}
	wire := key.Marshal()
	for _, a := range authorized {
		if bytes.Equal(a, wire) {
			return nil
		}
	}
	return fmt.Errorf("%s key %s is not authorized", key.Type(), ssh.FingerprintSHA256(key))
}

// server holds the state of one SSH connection.
type server struct {
	cfg      Config
	log      *slog.Logger
	ctx      context.Context // ends with the connection
	sessions atomic.Uint64
}

// openChannel accepts session channels and serves each in its own goroutine
// tracked by wg; it rejects every other channel type.
func (s *server) openChannel(wg *sync.WaitGroup, nc ssh.NewChannel) {
	if nc.ChannelType() != "session" {
		s.log.Debug("rejecting channel", "type", nc.ChannelType())
		_ = nc.Reject(ssh.UnknownChannelType, "only session channels are supported")
		return
	}
	ch, reqs, err := nc.Accept()
	if err != nil {
		s.log.Warn("accept session channel", "err", err)
		return
	}
	log := s.log.With("session", s.sessions.Add(1))
	wg.Go(func() { serveSession(log, ch, reqs) })
}

// globalRequests answers the connection's global requests until the
// connection ends.
func (s *server) globalRequests(reqs <-chan *ssh.Request) {
	for req := range reqs {
		switch req.Type {
		case agentproto.SetTimeRequest:
			ok := s.setTime(req.Payload)
			_ = req.Reply(ok, nil)
		case agentproto.InfoRequest:
			payload, err := infoPayload(s.cfg.Version)
			if err != nil {
				s.log.Warn("info request", "err", err)
				_ = req.Reply(false, nil)
				continue
			}
			_ = req.Reply(true, payload)
		case agentproto.NetReadyRequest:
			payload, err := s.netReady(s.ctx, req.Payload)
			if err != nil {
				s.log.Warn("net ready request", "err", err)
				_ = req.Reply(false, nil)
				continue
			}
			_ = req.Reply(true, payload)
		default:
			s.log.Debug("rejecting global request", "type", req.Type)
			_ = req.Reply(false, nil)
		}
	}
}

// clockTolerance is how far off the guest clock may be before SetTime
// changes it.
const clockTolerance = 100 * time.Millisecond

// setTime handles the payload of a SetTimeRequest and reports whether the
// clock was set.
func (s *server) setTime(payload []byte) bool {
	st, err := decodeSetTime(payload)
	if err != nil {
		s.log.Warn("set time", "err", err)
		return false
	}
	set := s.cfg.setClock
	if set == nil {
		set = setSystemClock
	}
	t := time.Unix(0, st.UnixNano)
	// What happens here is logged at debug level: it runs on every
	// restore's critical path, and each journal line wakes journald on the
	// guest's one vCPU before the reply goes out (the first exec after a
	// restore took ~40 ms less without these lines; docs/benchmarks.md).
	// Setting the clock wakes everything in the guest that watches it
	// (systemd re-plans its timers): leave a clock that is already right.
	if d := time.Until(t); d > -clockTolerance && d < clockTolerance {
		s.log.Debug("clock already right", "off_by", d)
	} else {
		if err := set(t); err != nil {
			s.log.Warn("set time", "err", err)
			return false
		}
		s.log.Debug("clock set", "time", t.UTC())
	}
	if len(st.Entropy) > 0 {
		reseed := s.cfg.reseed
		if reseed == nil {
			reseed = reseedKernel
		}
		if err := reseed(st.Entropy); err != nil {
			s.log.Warn("reseed", "err", err)
			return false
		}
		s.log.Debug("entropy pool reseeded", "bytes", len(st.Entropy))
	}
	return true
}

// decodeSetTime decodes and validates a SetTimeRequest payload.
func decodeSetTime(payload []byte) (agentproto.SetTime, error) {
	var p agentproto.ExecPayload
	if err := ssh.Unmarshal(payload, &p); err != nil {
		return agentproto.SetTime{}, fmt.Errorf("decode set time payload: %w", err)
	}
	var st agentproto.SetTime
	if err := decodeJSON([]byte(p.JSON), &st); err != nil {
		return agentproto.SetTime{}, fmt.Errorf("decode set time: %w", err)
	}
	if len(st.Entropy) > agentproto.MaxEntropy {
		return agentproto.SetTime{}, fmt.Errorf("decode set time: %d bytes of entropy, at most %d", len(st.Entropy), agentproto.MaxEntropy)
	}
	if st.UnixNano <= 0 {
		return agentproto.SetTime{}, fmt.Errorf("decode set time: unix_nano %d is not after the epoch", st.UnixNano)
	}
	return st, nil
}

// infoPayload returns the InfoRequest reply payload.
func infoPayload(version string) ([]byte, error) {
	return encodePayload(systemInfo(version))
}

// encodePayload wraps v's JSON in an agentproto.ExecPayload, the form of
// every global request's reply payload.
func encodePayload(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode reply: %w", err)
	}
	return ssh.Marshal(agentproto.ExecPayload{JSON: string(b)}), nil
}

// systemInfo collects the guest facts reported by InfoRequest. Facts that
// cannot be read are left empty.
func systemInfo(version string) agentproto.Info {
	info := agentproto.Info{AgentVersion: version, Kernel: kernelRelease(), Features: []string{agentproto.FeatureTransfer}}
	if h, err := os.Hostname(); err == nil {
		info.Hostname = h
	}
	if b, err := os.ReadFile(bootIDPath); err == nil {
		info.BootID = strings.TrimSpace(string(b))
	}
	return info
}
