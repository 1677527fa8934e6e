package gatewaytest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/vm"
)

// DaemonOptions configures an in-process vmgated for a benchmark.
type DaemonOptions struct {
	Dir         string // socket, state, audit log and policy go here
	ImageDir    string
	TemplateDir string
	Policy      []byte // the policy file's text
	MaxVMs      int
	PoolSize    int
	Ahead       int
	Accel       vm.Accel
	TBSizeMiB   int
	Log         *slog.Logger
}

// Daemon is the real gateway serving in this process on a Unix socket of
// its own: gateway.New, a listener, Serve in a goroutine, a client. Every
// in-process daemon test uses it (Start), and so do the benchmarks
// (StartDaemon, Serve).
type Daemon struct {
	Config    gateway.Config
	Socket    string
	AuditPath string
	Client    *client.Client

	srv    *gateway.Server
	cancel context.CancelFunc
	done   chan error
}

// StartDaemon writes o's policy into o.Dir and starts a daemon there.
func StartDaemon(ctx context.Context, o DaemonOptions) (*Daemon, error) {
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	pol := filepath.Join(o.Dir, "policy.toml")
	if err := os.WriteFile(pol, o.Policy, 0o600); err != nil {
		return nil, err
	}
	return Serve(ctx, gateway.Config{Socket: filepath.Join(o.Dir, "s.sock"), SocketMode: 0o600,
		VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: filepath.Join(o.Dir, "state"), TemplateDir: o.TemplateDir, Accel: o.Accel, TCGTBSizeMiB: o.TBSizeMiB},
			ImageDir: o.ImageDir, PoolSize: o.PoolSize, Ahead: o.Ahead},
		AuditPath: filepath.Join(o.Dir, "audit.jsonl"), MaxVMs: o.MaxVMs, QueueLen: 64, PolicyPath: pol,
		PolicyExplicit: true, AllowRoot: os.Geteuid() == 0, Log: o.Log})
}

// Serve builds the daemon from cfg (it listens on cfg.Socket, which Stop
// removes) and returns once it serves.
func Serve(ctx context.Context, cfg gateway.Config) (*Daemon, error) {
	if cfg.Socket == "" {
		return nil, errors.New("daemon: no socket")
	}
	srv, err := gateway.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	var ln net.Listener
	if ln, _, err = gateway.Listen(cfg, cfg.Log); err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("daemon: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	d := &Daemon{Config: cfg, Socket: cfg.Socket, AuditPath: cfg.AuditPath, Client: client.New(cfg.Socket),
		srv: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- srv.Serve(sctx, ln) }()
	return d, nil
}

// Stop shuts the daemon down (running commands get its grace period),
// releases it and returns Serve's error. It is safe to call twice.
func (d *Daemon) Stop() error {
	if d.cancel == nil {
		return nil
	}
	d.cancel()
	d.cancel = nil
	err := <-d.done
	_ = os.Remove(d.Socket)
	return errors.Join(err, d.srv.Close())
}

// Reload reloads the policy, as SIGHUP does.
func (d *Daemon) Reload() { d.srv.Reload() }

// WaitPool waits until the pool of VMs without a NIC holds n ready VMs
// (at most 5 min).
func (d *Daemon) WaitPool(ctx context.Context, n int) error { return d.WaitPoolOf(ctx, n, false) }

// WaitPoolOf waits until a pool of VMs with (network) or without a NIC
// holds n ready VMs (at most 5 min).
func (d *Daemon) WaitPoolOf(ctx context.Context, n int, network bool) error {
	deadline := time.Now().Add(5 * time.Minute)
	for {
		st, err := d.Client.Status(ctx)
		if err != nil {
			return err
		}
		for _, p := range st.Pools {
			if p.Network == network && p.Ready >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool (network %v) not ready after 5 min: %+v", network, st.Pools)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// HandshakeFailures reads the daemon's count of restores whose first agent
// handshake failed.
func (d *Daemon) HandshakeFailures(ctx context.Context) (int64, error) {
	st, err := d.Client.Status(ctx)
	if err != nil {
		return 0, err
	}
	return st.RestoreHandshakeFailures, nil
}
