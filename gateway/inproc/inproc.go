// Package inproc runs the real daemon in this process, on a Unix socket
// of its own: gateway.New, a listener, Serve in a goroutine, a client.
// The benchmarks (vmgated bench exec, bench agent) measure through it,
// and gateway/gatewaytest builds every in-process daemon test on it.
//
// It is part of the vmgated binary, so it imports no testing package
// (cmd/vmgated's deps test holds that): what only a test needs (a test's
// cleanup, the check that nothing of the daemon is left) lives in
// gatewaytest.
package inproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/e2bfront"
	"github.com/vmgate/vmgate/vm"
)

// Options configures a daemon for a benchmark (Start).
type Options struct {
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
	// E2B, when set, turns the E2B door on.
	E2B *e2bfront.Config
	// NetHosts pins guest DNS names (vmgated serve --net-hosts);
	// SecretRoots verifies the hosts of secrets (--secrets-roots).
	NetHosts    map[string][]netip.Addr
	SecretRoots string
}

// Daemon is the real gateway serving in this process on a Unix socket of
// its own, and a client of it.
type Daemon struct {
	Config    gateway.Config
	Socket    string
	AuditPath string
	Client    *client.Client

	srv    *gateway.Server
	cancel context.CancelFunc
	done   chan error
}

// Start writes o's policy into o.Dir and starts a daemon there.
func Start(ctx context.Context, o Options) (*Daemon, error) {
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	pol := filepath.Join(o.Dir, "policy.toml")
	if err := os.WriteFile(pol, o.Policy, 0o600); err != nil {
		return nil, err
	}
	return Serve(ctx, gateway.Config{Socket: filepath.Join(o.Dir, "s.sock"), SocketMode: 0o600,
		VM: vm.HostConfig{Runtime: vm.Runtime{StateDir: filepath.Join(o.Dir, "state"), TemplateDir: o.TemplateDir, Accel: o.Accel, TCGTBSizeMiB: o.TBSizeMiB,
			SecretRoots: o.SecretRoots}, ImageDir: o.ImageDir, PoolSize: o.PoolSize, Ahead: o.Ahead},
		AuditPath: filepath.Join(o.Dir, "audit.jsonl"), MaxVMs: o.MaxVMs, QueueLen: 64, PolicyPath: pol,
		PolicyExplicit: true, AllowRoot: os.Geteuid() == 0, Log: o.Log, E2B: o.E2B, NetHosts: o.NetHosts})
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
	ln, err := listen(cfg.Socket, cfg.SocketMode)
	if err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("daemon: %w", err)
	}
	sctx, cancel := context.WithCancel(ctx)
	d := &Daemon{Config: cfg, Socket: cfg.Socket, AuditPath: cfg.AuditPath, Client: client.New(cfg.Socket),
		srv: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { d.done <- srv.Serve(sctx, ln) }()
	return d, nil
}

// listen creates the daemon's socket at path with mode (0: 0660, as
// gateway.Config's default). It never takes a socket systemd passed to
// this process: a daemon in a benchmark or a test is not the service.
// The socket's directory is the caller's own (a temporary or work
// directory), so no other user can reach the socket before its mode is
// set.
func listen(path string, mode os.FileMode) (net.Listener, error) {
	if mode == 0 {
		mode = 0o660
	}
	if len(path) >= 108 {
		return nil, fmt.Errorf("socket path %s is too long (max 107 bytes)", path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket mode: %w", err)
	}
	return ln, nil
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
