package agent

import (
	"context"
	"encoding"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
)

// bootIDPath holds the kernel's random boot id.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// Config configures [Serve].
type Config struct {
	// Logger receives the agent's logs; nil means slog.Default().
	Logger *slog.Logger
	// Version is the agent version reported in the hello and in
	// agentproto.Info.
	Version string

	// setClock sets the system clock for CallSetTime; nil means
	// setSystemClock. Tests replace it so that they never touch the clock.
	setClock func(time.Time) error
	// reseed credits entropy and reseeds the kernel's generator; nil
	// means reseedKernel. Tests replace it.
	reseed func([]byte) error
	// netChecker answers CallNetReady; nil means the guest's own
	// network state. Tests replace it.
	netChecker *netChecker
	// lookupUser finds the unprivileged user's account; nil means
	// user.Lookup. Tests replace it with a fake account database.
	lookupUser lookupUserFunc
	// procs is the table of background processes, which outlives each
	// connection; nil means the process's one table (agentProcs). Main
	// makes its own; tests give each agent its own.
	procs *procTable
}

// agentProcs is the table of background processes shared by every
// connection Serve serves whose Config names none.
var agentProcs = sync.OnceValue(func() *procTable { return newProcTable(nil) })

// Serve serves one host connection on conn (package agentconn) until the
// connection ends or ctx is done, then closes conn. Commands still running
// when the connection ends are killed, and Serve returns only after they
// have been reaped and all of its goroutines have finished. Background
// processes (agentproto's proc calls) are the agent's, not the
// connection's: they run on, and the next connection finds them.
//
// Serve returns nil when the host closed the connection, ctx.Err() when
// ctx ended it, and an error when the host did not speak the protocol or
// the connection broke.
func Serve(ctx context.Context, conn net.Conn, cfg Config) error {
	_, err := serve(ctx, conn, cfg)
	return err
}

// serve implements Serve and also reports whether the host's hello
// arrived.
func serve(ctx context.Context, conn net.Conn, cfg Config) (helloDone bool, err error) {
	log := cfg.logger()
	if cfg.procs == nil {
		cfg.procs = agentProcs()
	}
	s := &server{cfg: cfg, log: log}
	helloDone, err = agentconn.Serve(ctx, conn, agentconn.ServeConfig{Handler: s, AgentVersion: cfg.Version, Log: log})
	if err != nil && ctx.Err() == nil {
		err = fmt.Errorf("host connection: %w", err)
	}
	return helloDone, err
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.Default()
	}
	return c.Logger
}

// server answers one host connection (agentconn.Handler).
type server struct {
	cfg      Config
	log      *slog.Logger
	sessions atomic.Uint64
}

// Open runs one command.
func (s *server) Open(_ context.Context, ch *agentconn.Channel, o agentproto.Open) {
	serveSession(s.log.With("session", s.sessions.Add(1)), ch, o, s.cfg.lookupUser)
}

// Call answers the host's calls.
func (s *server) Call(ctx context.Context, op string, args []byte) (encoding.BinaryMarshaler, error) {
	switch op {
	case agentproto.CallSetTime:
		return nil, s.setTime(args)
	case agentproto.CallInfo:
		return systemInfo(s.cfg.Version), nil
	case agentproto.CallNetReady:
		return s.netReady(ctx, args)
	case agentproto.CallProcStart, agentproto.CallProcList, agentproto.CallProcLogs, agentproto.CallProcInput, agentproto.CallProcSignal:
		return s.procCall(ctx, op, args)
	}
	s.log.Debug("rejecting call", "op", op)
	return nil, fmt.Errorf("unknown call %q", op)
}

// clockTolerance is how far off the guest clock may be before SetTime
// changes it.
const clockTolerance = 100 * time.Millisecond

// setTime handles a CallSetTime.
func (s *server) setTime(args []byte) error {
	st, err := decodeSetTime(args)
	if err != nil {
		s.log.Warn("set time", "err", err)
		return err
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
			return fmt.Errorf("set time: %w", err)
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
			return fmt.Errorf("reseed: %w", err)
		}
		s.log.Debug("entropy pool reseeded", "bytes", len(st.Entropy))
	}
	return nil
}

// decodeSetTime decodes and validates a CallSetTime's argument.
func decodeSetTime(args []byte) (agentproto.SetTime, error) {
	var st agentproto.SetTime
	if err := st.UnmarshalBinary(args); err != nil {
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

// features are what this agent can do beyond running commands
// (agentproto.Info.Features).
var features = []string{agentproto.FeatureTransfer, agentproto.FeatureUsers, agentproto.FeatureProcs, agentproto.FeatureFS}

// systemInfo collects the guest facts reported by CallInfo. Facts that
// cannot be read are left empty.
func systemInfo(version string) agentproto.Info {
	info := agentproto.Info{AgentVersion: version, Kernel: kernelRelease(), Features: slices.Clone(features)}
	if h, err := os.Hostname(); err == nil {
		info.Hostname = h
	}
	if b, err := os.ReadFile(bootIDPath); err == nil {
		info.BootID = strings.TrimSpace(string(b))
	}
	return info
}
