package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
)

const receiptsPolicy = `version = 1

[[profile]]
name = "agent"
match = { any = true }
max_vms = 2
max_vms_per_caller = 2
allow_shell = true
sessions = { allowed = true, idle_timeout = "10m", max_lifetime = "1h" }

[[profile.deny]]
name = "no-rm"
program = ["rm"]
`

// TestReceipts_EndToEnd: vm-exec --receipt keeps the receipt of a
// one-shot command, of a session's command and of a denial; vmgated
// receipt verify accepts them against the daemon's key and audit log
// (which audit verify accepts pinned to that key), and refuses a copy
// with one byte changed. One daemon, two VMs.
func TestReceipts_EndToEnd(t *testing.T) {
	vmexec := binary(t, "vm-exec")
	vmgated := binary(t, "vmgated")
	d := gatewaytest.Start(t, receiptsPolicy, func(c *gateway.Config) { c.MaxVMs = 2 })
	dir := t.TempDir()
	r1, r2, r3 := filepath.Join(dir, "oneshot.receipt"), filepath.Join(dir, "session.receipt"), filepath.Join(dir, "denied.receipt")

	cmd := exec.Command(vmexec, "--socket", d.Socket, "--receipt", r1, "sh", "-c", "cat; echo to-stderr >&2; exit 3")
	cmd.Stdin = strings.NewReader("hello\n")
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 || so.String() != "hello\n" {
		t.Fatalf("one-shot: %v, stdout %q, stderr %q", err, so.String(), se.String())
	}
	_, se2, code := runCmd(t, nil, vmexec, "--socket", d.Socket, "--session", "s1", "--receipt", r2, "-c", "echo in-session")
	if code != 0 {
		t.Fatalf("session: exit %d: %s", code, se2)
	}
	_, se3, code := runCmd(t, nil, vmexec, "--socket", d.Socket, "--receipt", r3, "rm", "-rf", "/")
	if code != wire.ExitDenied {
		t.Fatalf("rm: exit %d: %s", code, se3)
	}
	if err := d.Client.EndSession(t.Context(), "s1"); err != nil {
		t.Fatal(err)
	}

	// What the one-shot's receipt says.
	doc, err := os.ReadFile(r1)
	if err != nil {
		t.Fatal(err)
	}
	_, b, err := receipt.Parse(bytes.TrimSuffix(doc, []byte("\n")))
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := os.ReadFile(d.Config.PolicyPath)
	polSum := sha256.Sum256(pol)
	switch {
	case b.Stdin != receipt.StreamOf([]byte("hello\n")), b.Stdout != receipt.StreamOf([]byte("hello\n")), b.Stderr != receipt.StreamOf([]byte("to-stderr\n")):
		t.Errorf("streams %+v %+v %+v", b.Stdin, b.Stdout, b.Stderr)
	case b.ExitCode == nil || *b.ExitCode != 3 || b.Verdict != receipt.VerdictAllow || b.Profile != "agent":
		t.Errorf("outcome %+v", b)
	case b.Policy.SHA256 != hex.EncodeToString(polSum[:]) || b.Image == nil || len(b.Image.SHA256) != 64 || b.VMID == "":
		t.Errorf("policy %+v image %+v vm %q", b.Policy, b.Image, b.VMID)
	case len(b.Argv) != 3 || string(b.Argv[2]) != "cat; echo to-stderr >&2; exit 3" || b.Network.Mode != "none":
		t.Errorf("argv %q network %+v", b.Argv, b.Network)
	}

	pub := filepath.Join(dir, "daemon.pub")
	out, se4, code := runCmd(t, nil, vmgated, "receipt", "key", "--state-dir", d.Config.VM.StateDir)
	if code != 0 {
		t.Fatalf("receipt key: %d %s", code, se4)
	}
	if err := os.WriteFile(pub, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	out, se5, code := runCmd(t, nil, vmgated, "receipt", "verify", "--key", pub, "--audit", d.AuditPath, r1, r2, r3)
	if code != 0 || strings.Count(out, ": valid:") != 3 {
		t.Fatalf("receipt verify: exit %d\n%s%s", code, out, se5)
	}
	if !strings.Contains(out, "denied.receipt: valid: request") || !strings.Contains(out, ", deny;") {
		t.Errorf("the denial's receipt: %s", out)
	}
	if out, se, code := runCmd(t, nil, vmgated, "audit", "verify", "--key", pub, d.AuditPath); code != 0 || !strings.Contains(out, "checkpoints signed by") {
		t.Errorf("audit verify --key: exit %d\n%s%s", code, out, se)
	}
	bad := filepath.Join(dir, "changed.receipt")
	if err := os.WriteFile(bad, bytes.Replace(doc, []byte(`"exit_code":3`), []byte(`"exit_code":0`), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, _, code := runCmd(t, nil, vmgated, "receipt", "verify", "--key", pub, bad); code != 1 || !strings.Contains(out, "bad receipt signature") {
		t.Errorf("changed receipt: exit %d\n%s", code, out)
	}
}
