package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/vm"
)

const receiptPolicy = `version = 1

[[profile]]
name = "agent"
match = { any = true }

[[profile.deny]]
name = "no-rm"
program = ["rm"]
`

// unitDaemon runs the real daemon (New, Listen, Serve) on an image no VM
// boots from: everything up to a VM works, every VM start fails.
func unitDaemon(t *testing.T, mutate func(*Config)) (*Server, *client.Client, Config, func()) {
	t.Helper()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.toml")
	if err := os.WriteFile(pol, []byte(receiptPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Socket: filepath.Join(dir, "s.sock"), SocketMode: 0o600, PolicyPath: pol, PolicyExplicit: true,
		VM:        vm.HostConfig{Runtime: vm.Runtime{StateDir: filepath.Join(dir, "state")}, ImageDir: unbootableImage(t), NoTemplate: true},
		AuditPath: filepath.Join(dir, "audit.jsonl"), MaxVMs: 1, AllowRoot: true, Grace: time.Second,
		Log: slog.New(slog.DiscardHandler)}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, _, err := Listen(s.cfg, s.log)
	if err != nil {
		s.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	t.Cleanup(stop)
	return s, client.New(cfg.Socket), s.cfg, stop
}

// auditLines reads the audit log's records and line hashes by Seq.
func auditLines(t *testing.T, path string) map[uint64]struct {
	rec  audit.Record
	hash string
} {
	t.Helper()
	out := map[uint64]struct {
		rec  audit.Record
		hash string
	}{}
	_, err := audit.VerifyFilesWith(audit.VerifyOptions{Visit: func(r *audit.Record, h string) {
		out[r.Seq] = struct {
			rec  audit.Record
			hash string
		}{*r, h}
	}}, path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReceipts_Refusals: a denied request that asked for a receipt gets
// one that states the denial, signed by the daemon's key, pointing at its
// decision record; a request whose VM cannot start gets one that says
// so, pointing at its exec record; one that did not ask gets none. The
// daemon's chain starts with a checkpoint by the same key and ends with
// one when it stops.
func TestReceipts_Refusals(t *testing.T) {
	_, c, cfg, stop := unitDaemon(t, nil)
	ctx := context.Background()
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := receipt.ParsePublicKey([]byte(st.ReceiptPublicKey))
	if err != nil || receipt.Fingerprint(pub) != st.ReceiptKey {
		t.Fatalf("status key: %v %q", err, st.ReceiptKey)
	}
	onDisk, err := receipt.ReadPublicKey(filepath.Join(cfg.VM.StateDir, "receipt.pub"))
	if err != nil || !onDisk.Equal(pub) {
		t.Fatalf("receipt.pub: %v", err)
	}

	_, err = c.Exec(ctx, wire.ExecRequest{Argv: []string{"rm", "-rf", "/"}, Receipt: true}, client.ExecIO{})
	if !errors.Is(err, client.ErrDenied) {
		t.Fatalf("rm: %v", err)
	}
	denial, err := receipt.Verify(client.ReceiptOf(err), pub)
	if err != nil {
		t.Fatalf("denial receipt: %v", err)
	}
	if denial.Verdict != receipt.VerdictDeny || denial.Rule != "deny[0] no-rm" || denial.Reason == "" || denial.ExitCode != nil || denial.Image != nil {
		t.Errorf("denial receipt: %+v", denial)
	}
	if denial.Policy.Source != cfg.PolicyPath || denial.Policy.SHA256 == "" || *denial.Caller.UID != uint32(os.Getuid()) {
		t.Errorf("denial policy %+v caller %+v", denial.Policy, denial.Caller)
	}

	_, err = c.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}, Receipt: true}, client.ExecIO{})
	var ae *client.APIError
	if !errors.As(err, &ae) || ae.Body.Code != wire.CodeVM {
		t.Fatalf("true on an unbootable image: %v", err)
	}
	failed, err := receipt.Verify(client.ReceiptOf(err), pub)
	if err != nil {
		t.Fatalf("failure receipt: %v", err)
	}
	if failed.Verdict != receipt.VerdictAllow || !strings.Contains(failed.Error, "start vm") || failed.ExitCode != nil || failed.Image == nil || failed.Image.SHA256 == "" {
		t.Errorf("failure receipt: %+v", failed)
	}

	_, err = c.Exec(ctx, wire.ExecRequest{Argv: []string{"rm"}}, client.ExecIO{})
	if !errors.Is(err, client.ErrDenied) || client.ReceiptOf(err) != nil {
		t.Fatalf("no receipt asked: %v %s", err, client.ReceiptOf(err))
	}
	stop()

	lines := auditLines(t, cfg.AuditPath)
	for _, c := range []struct {
		b    *receipt.Body
		kind audit.Kind
	}{{denial, audit.KindDecision}, {failed, audit.KindExec}} {
		at, ok := lines[c.b.Audit.Seq]
		if !ok || at.hash != c.b.Audit.Hash || at.rec.Kind != c.kind || at.rec.RequestID != c.b.RequestID {
			t.Errorf("receipt %s points at seq %d, hash %s: the log has %+v", c.b.RequestID, c.b.Audit.Seq, c.b.Audit.Hash, at)
		}
		if head, ok := lines[c.b.Audit.HeadSeq]; !ok || head.hash != c.b.Audit.Head {
			t.Errorf("receipt's head seq %d: %+v", c.b.Audit.HeadSeq, head)
		}
	}
	reps, err := audit.VerifyFilesWith(audit.VerifyOptions{Keys: []ed25519.PublicKey{pub}}, cfg.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	r := reps[0]
	if r.Checkpoints < 2 || r.Unsigned != 0 || len(r.Keys) != 1 || r.Keys[0].Key != st.ReceiptKey {
		t.Errorf("checkpoints: %+v", r.Report)
	}
	if first := lines[r.Keys[0].FirstSeq]; !strings.Contains(first.rec.Message, "daemon started") {
		t.Errorf("first checkpoint: %+v", first.rec)
	}
}

// TestReceipts_KeyRefused: the daemon does not start without its key:
// missing after a first start, not readable by it alone, not a key, or a
// configured key that does not exist. Each error says what to do; none
// starts a daemon that would run without receipts.
func TestReceipts_KeyRefused(t *testing.T) {
	_, _, cfg, stop := unitDaemon(t, nil) // the first start makes the key
	stop()
	key := filepath.Join(cfg.VM.StateDir, receipt.DefaultKeyFile)
	keyData, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}
	start := func(mutate func(*Config)) error {
		c := cfg
		if mutate != nil {
			mutate(&c)
		}
		s, err := New(c)
		if err == nil {
			s.Close()
		}
		return err
	}
	for _, c := range []struct {
		name   string
		setup  func()
		mutate func(*Config)
		want   string
	}{
		{"removed", func() { _ = os.Remove(key) }, nil, "is missing, but its public half"},
		{"open to the group", func() { _ = os.WriteFile(key, keyData, 0o640); _ = os.Chmod(key, 0o640) }, nil, "chmod 600"},
		{"not a key", func() { _ = os.WriteFile(key, []byte("nonsense"), 0o600); _ = os.Chmod(key, 0o600) }, nil, "PRIVATE KEY"},
		{"configured, missing", nil, func(c *Config) { c.ReceiptKey = filepath.Join(t.TempDir(), "k.key") }, "openssl genpkey"},
	} {
		if c.setup != nil {
			c.setup()
		}
		err := start(c.mutate)
		if err == nil || !strings.Contains(err.Error(), "refusing to start without the receipt signing key") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// Restored, it starts again with the same key.
	if err := os.WriteFile(key, keyData, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := start(nil); err != nil {
		t.Fatalf("restored key: %v", err)
	}
}

// TestReceipts_ChainNamesKeyAtStart: each start puts a checkpoint naming
// the key into the chain, before any request.
func TestReceipts_ChainNamesKeyAtStart(t *testing.T) {
	s, _, cfg, stop := unitDaemon(t, func(c *Config) { c.CheckpointEvery = 2 })
	fp := receipt.Fingerprint(s.receiptKey.Public().(ed25519.PublicKey))
	stop()
	f, err := os.Open(cfg.AuditPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var kinds []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r audit.Record
		if err := json.Unmarshal(bytes.Clone(sc.Bytes()), &r); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, string(r.Kind))
		if r.Kind == audit.KindCheckpoint && r.Checkpoint.Key != fp {
			t.Errorf("checkpoint by %s, want %s", r.Checkpoint.Key, fp)
		}
	}
	if len(kinds) < 2 || kinds[0] != "daemon" || kinds[1] != "checkpoint" {
		t.Fatalf("records %v: want the start record, then a checkpoint", kinds)
	}
}
