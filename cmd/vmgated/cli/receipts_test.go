package cli

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/receipt"
)

// receiptFixture is an audit log written with a signing key and receipts
// of its records, as the daemon makes them.
type receiptFixture struct {
	dir, log, pub string
	key           ed25519.PrivateKey
	l             *audit.Log
}

func newReceiptFixture(t *testing.T) *receiptFixture {
	return newReceiptFixtureKey(t, ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, 32)))
}

// newReceiptFixtureKey is newReceiptFixture with the signing key key.
func newReceiptFixtureKey(t *testing.T, key ed25519.PrivateKey) *receiptFixture {
	t.Helper()
	dir := t.TempDir()
	f := &receiptFixture{dir: dir, log: filepath.Join(dir, "audit", "audit.jsonl"), pub: filepath.Join(dir, "daemon.pub"), key: key}
	if err := os.WriteFile(f.pub, receipt.MarshalPublicKey(f.key.Public().(ed25519.PublicKey)), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := audit.Open(audit.Options{Path: f.log, SyncInterval: -1, Signer: &audit.Signer{Key: f.key, Every: 4, Interval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	f.l = l
	if _, err := l.Checkpoint("daemon started"); err != nil {
		t.Fatal(err)
	}
	return f
}

// exec appends an exec record of request id (a decision record when
// denied) and writes its receipt, signed by key, to name; change alters
// the body before signing.
func (f *receiptFixture) exec(t *testing.T, id string, denied bool, key ed25519.PrivateKey, name string, change func(*receipt.Body)) string {
	t.Helper()
	out := receipt.StreamOf([]byte("out " + id))
	rec := audit.Record{Kind: audit.KindExec, RequestID: id, Argv: []string{"echo", id}, StdoutSHA256: out.SHA256,
		StderrSHA256: receipt.EmptySHA256, StdinSHA256: receipt.EmptySHA256}
	b := &receipt.Body{RequestID: id, Verdict: receipt.VerdictAllow, Argv: receipt.ArgvOf(rec.Argv), Stdout: out,
		Stderr: receipt.StreamOf(nil), Stdin: receipt.StreamOf(nil), Start: time.Now().UTC(), End: time.Now().UTC()}
	if denied {
		rec = audit.Record{Kind: audit.KindDecision, RequestID: id, Verdict: audit.VerdictDeny, Argv: rec.Argv}
		b.Verdict, b.Stdout = receipt.VerdictDeny, receipt.StreamOf(nil)
	}
	e, err := f.l.Append(rec)
	if err != nil {
		t.Fatal(err)
	}
	seq, head := f.l.Head()
	b.Audit = &receipt.AuditRef{Seq: e.Seq, Hash: e.Hash, HeadSeq: seq, Head: head}
	if change != nil {
		change(b)
	}
	doc, err := receipt.Sign(key, b)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(f.dir, "receipts", name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, append(doc, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func verifyOut(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, code, _ := verifyOutErr(t, args...)
	return out, code
}

// verifyOutErr is verifyOut with the command's error.
func verifyOutErr(t *testing.T, args ...string) (string, int, error) {
	t.Helper()
	// The command prints to os.Stdout: catch it.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		_, _ = b.ReadFrom(r)
		done <- b.String()
	}()
	_, rerr := run(t, append([]string{"receipt", "verify"}, args...)...)
	os.Stdout = old
	w.Close()
	return <-done, exitCode(rerr), rerr
}

// TestReceiptVerify: valid receipts pass, alone and against the audit
// log (across a rotation); every tamper case fails with exit status 1
// and names what failed; a bad command line exits 2.
func TestReceiptVerify(t *testing.T) {
	f := newReceiptFixture(t)
	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{4}, 32))
	ok1 := f.exec(t, "r1", false, f.key, "r1.receipt", nil)
	okDeny := f.exec(t, "r2", true, f.key, "r2.receipt.json", nil)
	if _, err := f.l.Reopen(f.log + ".1"); err != nil { // a rotation
		t.Fatal(err)
	}
	ok3 := f.exec(t, "r3", false, f.key, "r3.receipt", nil)
	_ = f.l.Close()
	auditDir := filepath.Dir(f.log)

	out, code := verifyOut(t, "--key", f.pub, "--audit", auditDir, filepath.Join(f.dir, "receipts"))
	if code != 0 || strings.Count(out, ": valid:") != 3 || !strings.Contains(out, "chain intact up to it") {
		t.Fatalf("valid receipts: exit %d\n%s", code, out)
	}
	if out, code := verifyOut(t, "--key", f.pub, ok1, okDeny); code != 0 || strings.Contains(out, "audit record") {
		t.Fatalf("signatures only: exit %d\n%s", code, out)
	}
	// Without --key the key is the local daemon's receipt.pub.
	state := t.TempDir()
	pubData, _ := os.ReadFile(f.pub)
	if err := os.WriteFile(filepath.Join(state, "receipt.pub"), pubData, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := verifyOut(t, "--state-dir", state, "--audit", auditDir, ok3); code != 0 || !strings.Contains(out, "key from "+filepath.Join(state, "receipt.pub")) {
		t.Fatalf("the local key: exit %d\n%s", code, out)
	}
	// JSON.
	jout, code := verifyOut(t, "--key", f.pub, "--audit", auditDir, "--json", ok1)
	var res []receiptResult
	if err := json.Unmarshal([]byte(jout), &res); err != nil || code != 0 || len(res) != 1 || !res[0].Valid || !res[0].AuditChecked || res[0].RequestID != "r1" {
		t.Fatalf("json: %v %d %s", err, code, jout)
	}

	data, _ := os.ReadFile(ok1)
	write := func(name string, b []byte) string {
		p := filepath.Join(f.dir, "bad", name)
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var doc receipt.Document
	_ = json.Unmarshal(data, &doc)
	other3, _ := os.ReadFile(ok3)
	var doc3 receipt.Document
	_ = json.Unmarshal(other3, &doc3)
	// Receipts made for this log but pointing elsewhere.
	reopen := func() {
		l, err := audit.Open(audit.Options{Path: f.log, SyncInterval: -1, Signer: &audit.Signer{Key: f.key, Every: 4, Interval: -1}})
		if err != nil {
			t.Fatal(err)
		}
		f.l = l
	}
	reopen()
	notLogged := f.exec(t, "r4", false, f.key, "r4.receipt", func(b *receipt.Body) { b.Audit.Seq, b.Audit.HeadSeq = 999, 999 })
	wrongHash := f.exec(t, "r5", false, f.key, "r5.receipt", func(b *receipt.Body) { b.Audit.Hash = strings.Repeat("0", 64) })
	wrongReq := f.exec(t, "r6", false, f.key, "r6.receipt", func(b *receipt.Body) { b.RequestID = "r1" })
	wrongOut := f.exec(t, "r7", false, f.key, "r7.receipt", func(b *receipt.Body) { b.Stdout = receipt.StreamOf([]byte("forged")) })
	wrongKind := f.exec(t, "r8", false, f.key, "r8.receipt", func(b *receipt.Body) { b.Verdict = receipt.VerdictDeny })
	foreign := f.exec(t, "r9", false, other, "r9.receipt", nil)
	noRecord := f.exec(t, "r10", true, f.key, "r10.receipt", func(b *receipt.Body) { b.Audit, b.AuditNote = nil, "held back" })
	_ = f.l.Close()
	for _, c := range []struct {
		name, file, want string
		audit            bool
	}{
		{"one changed byte", write("byte.receipt", bytes.Replace(data, []byte(`"request_id":"r1"`), []byte(`"request_id":"r0"`), 1)), "bad receipt signature", false},
		{"swapped signature", write("sig.receipt", bytes.Replace(data, []byte(doc.Sig), []byte(doc3.Sig), 1)), "bad receipt signature", false},
		{"another daemon's key", foreign, "receipt signed by an unknown key", false},
		{"another daemon's key, against the log", foreign, "receipt signed by an unknown key", true},
		{"not a receipt", write("junk.receipt", []byte("{}")), "malformed receipt", false},
		{"sequence number not in the log", notLogged, "seq 999 is not in the given audit log", true},
		{"hash not the log's", wrongHash, "the receipt says 0000", true},
		{"another request's record", wrongReq, `is request "r6"'s, not "r1"'s`, true},
		{"other stream hashes", wrongOut, "other stream hashes", true},
		{"other kind of record", wrongKind, "is a exec record, the receipt names a decision record", true},
		{"no record", noRecord, "names no audit record (held back)", true},
	} {
		args := []string{"--key", f.pub, c.file}
		if c.audit {
			args = append(args, "--audit", auditDir)
		}
		out, code := verifyOut(t, args...)
		if code != receiptInvalid || !strings.Contains(out, "INVALID") || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d\n%s\nwant %q", c.name, code, out, c.want)
		}
	}
	// The log cut before a receipt's record; a log changed before it.
	full, _ := os.ReadFile(f.log)
	lines := bytes.SplitAfter(full, []byte("\n"))
	cut := filepath.Join(f.dir, "cut", "audit.jsonl")
	_ = os.MkdirAll(filepath.Dir(cut), 0o755)
	_ = os.WriteFile(cut, bytes.Join(lines[:2], nil), 0o600)
	old, _ := os.ReadFile(f.log + ".1")
	_ = os.WriteFile(filepath.Join(filepath.Dir(cut), "audit.jsonl.1"), old, 0o600)
	if out, code := verifyOut(t, "--key", f.pub, "--audit", filepath.Dir(cut), ok3); code != receiptInvalid || !strings.Contains(out, "the log was truncated") {
		t.Errorf("truncated log: exit %d\n%s", code, out)
	}
	changed := bytes.Replace(old, []byte(`"echo","r1"`), []byte(`"echo","rX"`), 1)
	chdir := filepath.Join(f.dir, "changed")
	_ = os.MkdirAll(chdir, 0o755)
	_ = os.WriteFile(filepath.Join(chdir, "audit.jsonl.1"), changed, 0o600)
	_ = os.WriteFile(filepath.Join(chdir, "audit.jsonl"), full, 0o600)
	if out, code := verifyOut(t, "--key", f.pub, "--audit", chdir, okDeny); code != receiptInvalid || !strings.Contains(out, "audit chain broken") {
		t.Errorf("log changed before the record: exit %d\n%s", code, out)
	}

	// Usage errors exit 2.
	for _, args := range [][]string{{}, {"--bogus", ok1}, {"--key", filepath.Join(f.dir, "nope.pub"), ok1}, {"--key", f.pub, filepath.Join(f.dir, "missing")},
		{"--state-dir", t.TempDir(), ok1}} {
		if _, code := verifyOut(t, args...); code != receiptUsage {
			t.Errorf("%q: exit %d, want %d", args, code, receiptUsage)
		}
	}
	if out, code := verifyOut(t, "--key", f.pub, t.TempDir()); code != receiptInvalid {
		t.Errorf("no receipts in a directory: exit %d %s", code, out)
	}
}

// TestAuditVerifyKey: audit verify with --key accepts the daemon's log,
// and refuses one whose checkpoints another key made.
func TestAuditVerifyKey(t *testing.T) {
	f := newReceiptFixture(t)
	f.exec(t, "r1", false, f.key, "r1.receipt", nil)
	_ = f.l.Close()
	otherPub := filepath.Join(f.dir, "other.pub")
	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{4}, 32))
	_ = os.WriteFile(otherPub, receipt.MarshalPublicKey(other.Public().(ed25519.PublicKey)), 0o644)
	if _, err := run(t, "audit", "verify", "--key", f.pub, f.log); err != nil {
		t.Fatalf("pinned to the daemon's key: %v", err)
	}
	_, err := run(t, "audit", "verify", "--key", otherPub, f.log)
	if exitCode(err) != 1 || !strings.Contains(err.Error(), "not a pinned key") {
		t.Fatalf("pinned to another key: %v", err)
	}
}

// TestReceiptKey: receipt key prints the fingerprint and a public key
// file that receipt verify --key reads, from the public half beside the
// key or, when that is missing, from the key.
func TestReceiptKey(t *testing.T) {
	state := t.TempDir()
	k, _, err := receipt.LoadOrCreateKey(filepath.Join(state, receipt.DefaultKeyFile), true)
	if err != nil {
		t.Fatal(err)
	}
	fp := receipt.Fingerprint(k.Public().(ed25519.PublicKey))
	capture := func(args ...string) (string, error) {
		r, w, _ := os.Pipe()
		old := os.Stdout
		os.Stdout = w
		done := make(chan string)
		go func() {
			var b bytes.Buffer
			_, _ = b.ReadFrom(r)
			done <- b.String()
		}()
		_, err := run(t, args...)
		os.Stdout = old
		w.Close()
		return <-done, err
	}
	for _, removePub := range []bool{false, true} {
		if removePub {
			_ = os.Remove(filepath.Join(state, "receipt.pub"))
		}
		out, err := capture("receipt", "key", "--state-dir", state)
		if err != nil || !strings.HasPrefix(out, fp+" ") {
			t.Fatalf("receipt key: %v\n%s", err, out)
		}
		saved := filepath.Join(t.TempDir(), "d.pub")
		_ = os.WriteFile(saved, []byte(out), 0o644)
		pub, err := receipt.ReadPublicKey(saved)
		if err != nil || !pub.Equal(k.Public()) {
			t.Fatalf("its output as a key file: %v", err)
		}
	}
	if _, err := capture("receipt", "key", "--state-dir", t.TempDir()); err == nil || !strings.Contains(err.Error(), "creates the key at its first start") {
		t.Fatalf("no key: %v", err)
	}
}

// TestReceiptVerify_LogKeysNotTrusted: whoever can write the audit log
// (a collector, a backup, a copy shipped off the host) writes a log of
// their own, its checkpoints and a record under their key, and signs a
// receipt of that record with it. receipt verify --audit must not take
// the key from that log: without --key it uses the local daemon's
// receipt.pub, which refuses the forgery, and without that it refuses to
// guess and asks for --key; the daemon's key passed with --key refuses it
// too. Before, without --key, the forged receipt was "valid" (exit 0),
// its key "from the audit log's checkpoints" (issue 43, item 3).
func TestReceiptVerify_LogKeysNotTrusted(t *testing.T) {
	daemon := newReceiptFixture(t)
	daemon.exec(t, "r1", false, daemon.key, "r1.receipt", nil)
	_ = daemon.l.Close()
	forger := newReceiptFixtureKey(t, ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, 32)))
	forged := forger.exec(t, "r1", false, forger.key, "forged.receipt", nil)
	_ = forger.l.Close()
	forgedLog := filepath.Dir(forger.log)
	// The forger's log and receipt hold together: against the forger's
	// own key they are valid, so only the key makes the difference.
	if out, code := verifyOut(t, "--key", forger.pub, "--audit", forgedLog, forged); code != 0 {
		t.Fatalf("the forgery against its own key: exit %d\n%s", code, out)
	}
	local := t.TempDir()
	pubData, _ := os.ReadFile(daemon.pub)
	if err := os.WriteFile(filepath.Join(local, "receipt.pub"), pubData, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no --key, no local key", []string{"--state-dir", t.TempDir()}, receiptUsage, "pass --key"},
		{"no --key, no state directory", []string{"--state-dir", ""}, receiptUsage, "pass --key"},
		{"no --key, the local daemon's key", []string{"--state-dir", local}, receiptInvalid, "not a pinned key"},
		{"the daemon's key", []string{"--key", daemon.pub}, receiptInvalid, "not a pinned key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(c.args, "--audit", forgedLog, forged)
			out, code, err := verifyOutErr(t, args...)
			msg := out
			if err != nil {
				msg += err.Error()
			}
			if code != c.code || strings.Contains(out, ": valid:") || !strings.Contains(msg, c.want) {
				t.Errorf("exit %d, want %d and %q\n%s", code, c.code, c.want, msg)
			}
		})
	}
}
