// Package gatewaytest runs the real daemon in this process for a test, as
// net/http/httptest runs a real server: its socket, state, audit log and
// policy in a temporary directory, on the test image, with the test's
// changes to the configuration; at the end of the test it is stopped and
// nothing of it may be left. Every in-process daemon test uses it. The
// daemon itself is gateway/inproc's (gateway.New, a listener, Serve),
// which the benchmarks use without this package's test harness.
package gatewaytest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/inproc"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
)

// Daemon is an in-process daemon (inproc.Daemon: its configuration,
// socket, audit log, client, Stop, Reload, WaitPool) with a test's checks
// and helpers.
type Daemon struct {
	*inproc.Daemon
}

// Start starts a daemon for t: its socket, state, audit log and (when
// policy is not empty) policy file in a temporary directory, on the test
// image (testutil.RequiresImage), with --allow-root, at most 2 VMs, a grace
// of 2 s, VMs booted cold unless mutate turns templates on, warnings on
// stderr. mutate, if set, adjusts the configuration.
func Start(t testing.TB, policy string, mutate func(*gateway.Config)) *Daemon {
	t.Helper()
	img := testutil.RequiresImage(t)
	dir := t.TempDir()
	cfg := gateway.Config{Socket: filepath.Join(dir, "gw.sock"), SocketMode: 0o666,
		VM:        vm.HostConfig{Runtime: vm.Runtime{StateDir: filepath.Join(dir, "state"), Accel: vm.AccelAuto}, ImageDir: img, NoTemplate: true},
		AuditPath: filepath.Join(dir, "audit.jsonl"), MaxVMs: 2, AllowRoot: true, Grace: 2 * time.Second,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if policy != "" {
		cfg.PolicyPath, cfg.PolicyExplicit = filepath.Join(dir, "policy.toml"), true
		if err := os.WriteFile(cfg.PolicyPath, []byte(policy), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if mutate != nil {
		mutate(&cfg)
	}
	d, err := inproc.Serve(context.Background(), cfg)
	if err != nil {
		t.Fatalf("daemon: %v", err)
	}
	td := &Daemon{Daemon: d}
	t.Cleanup(func() { td.StopAndCheck(t) })
	return td
}

// StopAndCheck stops the daemon and checks that nothing of it is left: no
// VM directory, no socket. It is safe to call twice.
func (d *Daemon) StopAndCheck(t testing.TB) {
	t.Helper()
	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("daemon: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Error("daemon did not stop")
		return
	}
	if ents, _ := os.ReadDir(filepath.Join(d.Config.VM.StateDir, "vms")); len(ents) != 0 {
		t.Errorf("VM directories left after shutdown: %v", ents)
	}
	if _, err := os.Stat(d.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket not removed: %v", err)
	}
}

// Exec runs a command through the daemon, collecting its streams.
func (d *Daemon) Exec(t testing.TB, req wire.ExecRequest, stdin io.Reader) (*wire.Result, string, string, error) {
	t.Helper()
	var so, se bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := d.Client.Exec(ctx, req, client.ExecIO{Stdin: stdin, Stdout: &so, Stderr: &se})
	return res, so.String(), se.String(), err
}

// MustExec is Exec that fails the test on an error.
func (d *Daemon) MustExec(t testing.TB, req wire.ExecRequest, stdin io.Reader) (*wire.Result, string, string) {
	t.Helper()
	res, so, se, err := d.Exec(t, req, stdin)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return res, so, se
}
