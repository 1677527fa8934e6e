package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/receipt"
)

func cpKey(seed byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
}

func pubOf(k ed25519.PrivateKey) ed25519.PublicKey { return k.Public().(ed25519.PublicKey) }

// signedLog writes n records to a Log that checkpoints every `every`
// records, closes it and returns its lines (with newlines).
func signedLog(t *testing.T, key ed25519.PrivateKey, every, n int) [][]byte {
	t.Helper()
	m := newMemFile(nil)
	l := openMem(t, m, Options{Signer: &Signer{Key: key, Every: every, Interval: -1}})
	writeN(t, l, 1, n)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return lines(m.bytes())
}

func lines(b []byte) [][]byte {
	out := bytes.SplitAfter(b, []byte("\n"))
	return out[:len(out)-1]
}

func parsed(t *testing.T, line []byte) Record {
	t.Helper()
	r, err := parseLine(bytes.TrimSuffix(line, []byte("\n")))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// rechain renumbers lines and recomputes every Prev, as someone who can
// write the log but lacks the key would after editing it.
func rechain(t *testing.T, ls [][]byte) [][]byte {
	t.Helper()
	var out [][]byte
	prev := GenesisPrev
	for i, l := range ls {
		r := parsed(t, l)
		r.Seq, r.Prev = uint64(i+1), prev
		line, err := encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, line)
		prev = lineHash(bytes.TrimSuffix(line, []byte("\n")))
	}
	return out
}

// TestCheckpoints_Every: a checkpoint follows every Every records and
// ends a closed log; each signs the chain head before it, and Verify
// counts them, names the key and the records no checkpoint covers.
func TestCheckpoints_Every(t *testing.T) {
	k := cpKey(1)
	ls := signedLog(t, k, 3, 7)
	var kinds []Kind
	for _, l := range ls {
		kinds = append(kinds, parsed(t, l).Kind)
	}
	want := []Kind{KindExec, KindExec, KindExec, KindCheckpoint, KindExec, KindExec, KindExec, KindCheckpoint, KindExec, KindCheckpoint}
	if !slicesEqual(kinds, want) {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	cp := parsed(t, ls[3])
	if cp.Checkpoint.Key != receipt.Fingerprint(pubOf(k)) || cp.Prev != lineHash(bytes.TrimSuffix(ls[2], []byte("\n"))) {
		t.Fatalf("checkpoint %+v", cp)
	}
	var visited int
	rep, err := VerifyWith(bytes.NewReader(bytes.Join(ls, nil)), VerifyOptions{Keys: []ed25519.PublicKey{pubOf(k)}, Visit: func(*Record, string) { visited++ }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Checkpoints != 3 || rep.LastCheckpointSeq != 10 || rep.Unsigned != 0 || len(rep.Keys) != 1 || rep.Keys[0].Checkpoints != 3 || visited != 10 {
		t.Fatalf("report %+v, visited %d", rep, visited)
	}
	// Cut after the 9th line: one record is not covered.
	rep, err = Verify(bytes.NewReader(bytes.Join(ls[:9], nil)))
	if err != nil || rep.Unsigned != 1 || rep.LastCheckpointSeq != 8 {
		t.Fatalf("tail: %+v %v", rep, err)
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCheckpoints_Tamper: what Verify says of a log changed after it was
// signed, by someone without the key.
func TestCheckpoints_Tamper(t *testing.T) {
	k, other := cpKey(1), cpKey(2)
	pinned := VerifyOptions{Keys: []ed25519.PublicKey{pubOf(k)}}
	ls := signedLog(t, k, 3, 7)
	verify := func(ls [][]byte, o VerifyOptions) error {
		_, err := VerifyWith(bytes.NewReader(bytes.Join(ls, nil)), o)
		return err
	}

	// A record changed and the chain recomputed after it: the
	// checkpoints' signatures no longer hold, even unpinned.
	edited := append([][]byte(nil), ls...)
	r := parsed(t, edited[1])
	r.Argv = []string{"echo", "harmless"}
	edited[1], _ = encode(&r)
	err := verify(rechain(t, edited), VerifyOptions{})
	if !errors.Is(err, ErrCheckpoint) || !errors.Is(err, ErrChainBroken) || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("edited and rechained: %v", err)
	}

	// The checkpoints removed and the chain recomputed: intact as an
	// unkeyed chain, refused against the pinned key.
	var stripped [][]byte
	for _, l := range ls {
		if parsed(t, l).Kind != KindCheckpoint {
			stripped = append(stripped, l)
		}
	}
	stripped = rechain(t, stripped)
	if err := verify(stripped, VerifyOptions{}); err != nil {
		t.Errorf("stripped, unpinned: %v", err)
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "audit.jsonl")
	if err := os.WriteFile(p, bytes.Join(stripped, nil), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyFilesWith(pinned, p); !errors.Is(err, ErrNoCheckpoint) {
		t.Errorf("stripped, pinned: %v", err)
	}

	// Rewritten wholesale and signed with another key: each checkpoint
	// holds under its own key; the pin refuses that key.
	m := newMemFile(nil)
	forger := openMem(t, m, Options{Signer: &Signer{Key: other, Every: 3, Interval: -1}})
	writeN(t, forger, 1, 7)
	_ = forger.Close()
	forgedLog := lines(m.bytes())
	if err := verify(forgedLog, VerifyOptions{}); err != nil {
		t.Errorf("forged, unpinned: %v", err)
	}
	err = verify(forgedLog, pinned)
	if !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), "not a pinned key") || !strings.Contains(err.Error(), receipt.Fingerprint(pubOf(other))) {
		t.Errorf("forged, pinned: %v", err)
	}

	// A checkpoint's signature changed, its public key swapped, its key
	// named falsely, a checkpoint field on another record.
	for name, change := range map[string]func(*Record){
		"signature": func(r *Record) {
			sig, _ := base64.StdEncoding.DecodeString(r.Checkpoint.Sig)
			sig[0] ^= 1
			r.Checkpoint.Sig = base64.StdEncoding.EncodeToString(sig)
		},
		"public key": func(r *Record) { r.Checkpoint.PublicKey = receipt.EncodePublicKey(pubOf(other)) },
		"key name":   func(r *Record) { r.Checkpoint.Key = receipt.Fingerprint(pubOf(other)) },
		"time":       func(r *Record) { r.Time = r.Time.Add(1) },
		"no sig":     func(r *Record) { r.Checkpoint = nil },
	} {
		bad := append([][]byte(nil), ls...)
		r := parsed(t, bad[3])
		change(&r)
		bad[3], _ = encode(&r)
		if err := verify(rechain(t, bad), VerifyOptions{}); !errors.Is(err, ErrCheckpoint) {
			t.Errorf("checkpoint %s changed: %v", name, err)
		}
	}
	carried := append([][]byte(nil), ls...)
	r = parsed(t, carried[1])
	r.Checkpoint = parsed(t, ls[3]).Checkpoint
	carried[1], _ = encode(&r)
	if err := verify(rechain(t, carried), VerifyOptions{}); !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), "exec record carries a checkpoint") {
		t.Errorf("checkpoint on an exec record: %v", err)
	}
}

// TestCheckpoints_Explicit: Log.Checkpoint writes one at once (the
// daemon's start), the interval writes one only after new records, and
// callers cannot write checkpoint records themselves.
func TestCheckpoints_Explicit(t *testing.T) {
	k := cpKey(1)
	m := newMemFile(nil)
	l := openMem(t, m, Options{Signer: &Signer{Key: k, Every: 100, Interval: -1}})
	e, err := l.Checkpoint("daemon started")
	if err != nil || e.Seq != 1 {
		t.Fatalf("checkpoint: %+v %v", e, err)
	}
	if _, h := l.Head(); h != e.Hash {
		t.Fatalf("entry hash %s, head %s", e.Hash, h)
	}
	if l.KeyFingerprint() != receipt.Fingerprint(pubOf(k)) {
		t.Fatal(l.KeyFingerprint())
	}
	l.checkpointIfDue() // nothing written since: no checkpoint
	writeN(t, l, 1, 1)
	l.checkpointIfDue()
	if err := l.Write(Record{Kind: KindCheckpoint}); err == nil {
		t.Error("a caller wrote a checkpoint record")
	}
	if err := l.Write(Record{Kind: KindDaemon, Checkpoint: &Checkpoint{}}); err == nil {
		t.Error("a caller wrote a checkpoint field")
	}
	_ = l.Close()
	var kinds []Kind
	for _, ln := range lines(m.bytes()) {
		kinds = append(kinds, parsed(t, ln).Kind)
	}
	if want := []Kind{KindCheckpoint, KindExec, KindCheckpoint}; !slicesEqual(kinds, want) {
		t.Fatalf("kinds %v, want %v", kinds, want)
	}
	// Append returns where each record went.
	m2 := newMemFile(nil)
	l2 := openMem(t, m2, Options{})
	e1, err := l2.Append(rec(1))
	if err != nil || e1.Seq != 1 {
		t.Fatal(e1, err)
	}
	if got := lineHash(bytes.TrimSuffix(m2.bytes(), []byte("\n"))); got != e1.Hash {
		t.Fatalf("entry hash %s, line hash %s", e1.Hash, got)
	}
}

// TestCheckpoints_Rotation: the old file ends with a checkpoint, the new
// one has one after its rotate record; the series verifies pinned.
func TestCheckpoints_Rotation(t *testing.T) {
	k := cpKey(1)
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(Options{Path: path, SyncInterval: -1, Signer: &Signer{Key: k, Every: 100, Interval: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	writeRecs(t, l, 2)
	if rotated, err := l.Reopen(""); err != nil || rotated {
		t.Fatalf("reload without rotation: %v %v", rotated, err)
	}
	if rotated, err := l.Reopen(path + ".1"); err != nil || !rotated {
		t.Fatalf("rotate: %v %v", rotated, err)
	}
	writeRecs(t, l, 1)
	_ = l.Close()
	old, _ := os.ReadFile(path + ".1")
	cur, _ := os.ReadFile(path)
	ol, nl := lines(old), lines(cur)
	if len(ol) != 3 || parsed(t, ol[2]).Kind != KindCheckpoint {
		t.Fatalf("old file: %s", old)
	}
	if len(nl) != 4 || parsed(t, nl[0]).Kind != KindRotate || parsed(t, nl[1]).Kind != KindCheckpoint || parsed(t, nl[3]).Kind != KindCheckpoint {
		t.Fatalf("new file: %s", cur)
	}
	reps, err := VerifyFilesWith(VerifyOptions{Keys: []ed25519.PublicKey{pubOf(k)}}, dir)
	if err != nil || len(reps) != 2 || reps[0].Checkpoints != 1 || reps[1].Checkpoints != 2 {
		t.Fatalf("%+v %v", reps, err)
	}
}
