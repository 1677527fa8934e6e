package audit

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/gateway/receipt"
)

// Checkpoints. With a Signer the Log appends a checkpoint record (Kind
// checkpoint) that signs the chain so far with the daemon's receipt key:
// after every Signer.Every records, at least every Signer.Interval while
// records are written, at both ends of a rotation (the old file's last
// record and the new file's second, after its rotate record), when the
// Log is closed, and when the daemon asks (Log.Checkpoint: at start, so
// that each run's key is in the chain). A checkpoint names its key by
// fingerprint and carries the public key; Verify checks each signature,
// and VerifyOptions.Keys pins the keys it accepts. See the package
// documentation for what this does and does not prove.

// Defaults of a Signer's zero values.
const (
	DefaultCheckpointEvery    = 1000
	DefaultCheckpointInterval = 5 * time.Minute
)

// CheckpointPrefix starts the message a checkpoint signs; a receipt
// signs under another prefix, so neither signature passes for the other.
const CheckpointPrefix = "vmgate-audit-checkpoint-v1\n"

// ErrCheckpoint is wrapped (with ErrChainBroken) by Verify's errors about
// a checkpoint whose signature does not hold, and by VerifyFilesWith's
// about keys that are not pinned or checkpoints that are missing.
var ErrCheckpoint = errors.New("bad checkpoint")

// Signer configures the Log's checkpoints.
type Signer struct {
	// Key signs them (the daemon's receipt key).
	Key ed25519.PrivateKey
	// Every is the number of records after which a checkpoint is due
	// (0: DefaultCheckpointEvery).
	Every int
	// Interval bounds the time between checkpoints while records are
	// written (0: DefaultCheckpointInterval; negative: no timer).
	Interval time.Duration
}

// Checkpoint is a checkpoint record's signature: Sig, base64, is the
// ed25519 signature by the key named Key (its receipt.Fingerprint, public
// half PublicKey in unpadded base64) of CheckpointMessage of the record.
type Checkpoint struct {
	Key       string `json:"key"`
	PublicKey string `json:"public_key"`
	Sig       string `json:"sig"`
}

// CheckpointMessage is what the checkpoint record r signs: its Seq, its
// Prev (the hash of the line before it: the chain head it attests), its
// Time and its key's fingerprint.
func CheckpointMessage(r *Record, key string) []byte {
	return fmt.Appendf(nil, "%sseq %d\nprev %s\ntime %s\nkey %s\n", CheckpointPrefix, r.Seq, r.Prev, r.Time.UTC().Format(time.RFC3339Nano), key)
}

// signer is a Signer ready for use.
type signer struct {
	key      ed25519.PrivateKey
	fp, pub  string
	every    int
	interval time.Duration
}

func newSigner(s Signer) (*signer, error) {
	if len(s.Key) != ed25519.PrivateKeySize {
		return nil, errors.New("audit log: checkpoint signer: not an ed25519 private key")
	}
	pub := s.Key.Public().(ed25519.PublicKey)
	sg := &signer{key: s.Key, fp: receipt.Fingerprint(pub), pub: receipt.EncodePublicKey(pub), every: s.Every, interval: s.Interval}
	if sg.every <= 0 {
		sg.every = DefaultCheckpointEvery
	}
	if sg.interval == 0 {
		sg.interval = DefaultCheckpointInterval
	}
	return sg, nil
}

// sign fills in r's Checkpoint; r's Seq, Prev and Time are set.
func (s *signer) sign(r *Record) {
	sig := ed25519.Sign(s.key, CheckpointMessage(r, s.fp))
	r.Checkpoint = &Checkpoint{Key: s.fp, PublicKey: s.pub, Sig: base64.StdEncoding.EncodeToString(sig)}
}

// checkCheckpoint verifies the checkpoint of record r (its line parsed).
func checkCheckpoint(r *Record) error {
	c := r.Checkpoint
	if c == nil {
		return errors.New("checkpoint record without its signature")
	}
	pub, err := receipt.DecodePublicKey(c.PublicKey)
	if err != nil {
		return fmt.Errorf("checkpoint public key: %w", err)
	}
	if fp := receipt.Fingerprint(pub); fp != c.Key {
		return fmt.Errorf("checkpoint names key %s but carries the public key of %s", c.Key, fp)
	}
	sig, err := base64.StdEncoding.Strict().DecodeString(c.Sig)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return errors.New("checkpoint signature is not base64 of an ed25519 signature")
	}
	if !ed25519.Verify(pub, CheckpointMessage(r, c.Key), sig) {
		return fmt.Errorf("the signature by %s does not match the chain head it signs: the log was changed before this line", c.Key)
	}
	return nil
}

// countLocked counts r towards the next checkpoint. Precondition: l.mu
// is held and r was appended.
func (l *Log) countLocked(r *Record) {
	if r.Kind == KindCheckpoint {
		l.sinceCP = 0
	} else {
		l.sinceCP++
	}
}

// checkpointLocked appends a checkpoint record saying why, and returns it
// (for the mirror), or nil when it could not be written: the Log is then
// failed, and says why. Precondition: l.mu is held, the Log is healthy
// and has a signer.
func (l *Log) checkpointLocked(why string) *Record {
	r := &Record{Kind: KindCheckpoint, Message: "checkpoint: " + why}
	if err := l.appendLocked(r); err != nil {
		l.logger.Error("audit checkpoint not written", "err", err)
		return nil
	}
	return r
}

// Checkpoint appends a checkpoint now, saying why (the daemon's start:
// the chain then names the key of every run). It returns the checkpoint's
// place in the chain; without a signer it does nothing and returns a
// zero Entry.
func (l *Log) Checkpoint(why string) (Entry, error) {
	if l.signer == nil {
		return Entry{}, nil
	}
	l.mu.Lock()
	if l.err != nil {
		defer l.mu.Unlock()
		return Entry{}, l.err
	}
	cp := l.checkpointLocked(why)
	e, err := Entry{Seq: l.seq, Hash: l.head}, l.err
	l.mu.Unlock()
	if cp == nil {
		return Entry{}, err
	}
	if l.mirror != nil {
		l.mirror(*cp)
	}
	return e, nil
}

// KeyFingerprint is the fingerprint of the key that signs the Log's
// checkpoints, "" without one.
func (l *Log) KeyFingerprint() string {
	if l.signer == nil {
		return ""
	}
	return l.signer.fp
}

// armCheckpointTimer starts the interval timer of a Log with a signer.
func (l *Log) armCheckpointTimer() {
	if l.signer == nil || l.signer.interval < 0 {
		return
	}
	l.cpTimer = time.AfterFunc(l.signer.interval, l.timedCheckpoint)
}

// timedCheckpoint is the interval timer's function: a checkpoint if one
// is due, and the timer armed again.
func (l *Log) timedCheckpoint() {
	l.checkpointIfDue()
	l.mu.Lock()
	if !l.closed {
		l.cpTimer.Reset(l.signer.interval)
	}
	l.mu.Unlock()
}

// checkpointIfDue writes a checkpoint when records were written since
// the last one.
func (l *Log) checkpointIfDue() {
	l.mu.Lock()
	var cp *Record
	if l.err == nil && l.sinceCP > 0 {
		cp = l.checkpointLocked(fmt.Sprintf("every %v", l.signer.interval))
	}
	l.mu.Unlock()
	if cp != nil && l.mirror != nil {
		l.mirror(*cp)
	}
}
