package bench

import (
	"context"
	"fmt"
	"log/slog"
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
	Accel       vm.Accel
	Log         *slog.Logger
}

// Daemon is the real gateway running in this process on its own socket.
type Daemon struct {
	Socket    string
	AuditPath string
	Client    *client.Client
	cancel    context.CancelFunc
	done      chan error
}

// StartDaemon starts the gateway and returns once it serves requests.
func StartDaemon(ctx context.Context, o DaemonOptions) (*Daemon, error) {
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	pol := filepath.Join(o.Dir, "policy.toml")
	if err := os.WriteFile(pol, o.Policy, 0o600); err != nil {
		return nil, err
	}
	d := &Daemon{Socket: filepath.Join(o.Dir, "s.sock"), AuditPath: filepath.Join(o.Dir, "audit.jsonl"), done: make(chan error, 1)}
	ready := make(chan struct{})
	dctx, cancel := context.WithCancel(ctx)
	d.cancel = cancel
	cfg := gateway.Config{Socket: d.Socket, SocketMode: 0o600, StateDir: filepath.Join(o.Dir, "state"), ImageDir: o.ImageDir,
		AuditPath: d.AuditPath, MaxVMs: o.MaxVMs, QueueLen: 64, PolicyPath: pol, PolicyExplicit: true, Accel: o.Accel,
		AllowRoot: os.Geteuid() == 0, Log: o.Log, PoolSize: o.PoolSize, TemplateDir: o.TemplateDir, Ready: func() { close(ready) }}
	go func() { d.done <- gateway.Run(dctx, cfg) }()
	select {
	case <-ready:
	case err := <-d.done:
		cancel()
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d.Client = client.New(d.Socket)
	return d, nil
}

// Stop shuts the daemon down and returns its exit error.
func (d *Daemon) Stop() error {
	d.cancel()
	return <-d.done
}

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
		pools, _ := st["pools"].([]any)
		for _, p := range pools {
			m, _ := p.(map[string]any)
			if nic, _ := m["network"].(bool); m != nil && nic == network {
				if r, _ := m["ready"].(float64); int(r) >= n {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pool (network %v) not ready after 5 min: %v", network, st)
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
	n, _ := st["restore_handshake_failures"].(float64)
	return int64(n), nil
}
