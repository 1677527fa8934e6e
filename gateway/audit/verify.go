package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/receipt"
)

// ErrChainBroken is wrapped by every error of [Verify] that shows the log
// is not an intact chain: an unparsable or torn line, a Seq gap or a Prev
// mismatch.
var ErrChainBroken = errors.New("audit chain broken")

// Report summarises a verified log, or the part of it before the first
// broken line.
type Report struct {
	// Lines is the number of intact lines.
	Lines int
	// FirstSeq and LastSeq are the Seq of the first and last intact line.
	FirstSeq, LastSeq uint64
	// FirstTime and LastTime are their times.
	FirstTime, LastTime time.Time
	// Head is the hex SHA-256 of the last intact line ([GenesisPrev] if
	// none); compare it with an anchor from [Log.Head].
	Head string
	// BrokenLine is the 1-based number of the first broken line, 0 if
	// the chain is intact.
	BrokenLine int
	// ContinuesSeq and ContinuesHead, for a file that continues the chain
	// of an earlier one (its first record is KindRotate), are the Seq and
	// hash of that file's last record; 0 and "" for a file that starts
	// the chain.
	ContinuesSeq  uint64
	ContinuesHead string
	// Predecessor is what that first record says of the file it
	// continues (nil in logs written before rotate records named it).
	Predecessor *Predecessor
	// Checkpoints counts the intact checkpoint records (each signature
	// checked), LastCheckpointSeq is the Seq of the last one (0: none),
	// and Keys are the keys that signed them, in order of first use.
	// Unsigned counts the intact records after the last checkpoint (all
	// of them without one): no signature covers them yet.
	Checkpoints       int
	LastCheckpointSeq uint64
	Keys              []KeyUse
	Unsigned          int
}

// KeyUse is a key that signed checkpoints of a file: its fingerprint,
// public key (unpadded base64), and the Seqs of its first and last
// checkpoint there.
type KeyUse struct {
	Key, PublicKey    string
	FirstSeq, LastSeq uint64
	Checkpoints       int
}

// VerifyOptions adds to Verify's checks.
type VerifyOptions struct {
	// Keys, when set, pins the checkpoints' keys: a checkpoint by any
	// other key is an error, and VerifyFilesWith requires at least one
	// checkpoint. Without them each checkpoint's signature is checked
	// against the public key it carries, which shows the log is whole as
	// that key signed it, not whose key it is.
	Keys []ed25519.PublicKey
	// Visit, if set, is called with each intact record and the hash of
	// its line, in order.
	Visit func(rec *Record, hash string)
}

// Verify reads a log from r and checks that every line is a record
// terminated by a newline, that Seq runs 1, 2, 3, … and that every Prev is
// the SHA-256 of the line before (GenesisPrev on line 1). It stops at the
// first broken line and returns an error wrapping [ErrChainBroken] (and
// [ErrTornLine] for a final line without newline) that names the line and
// the fault, e.g. "audit chain broken: line 7: prev mismatch …", with a
// Report of the intact lines before it.
//
// A modified line is usually reported on the line after it, whose Prev no
// longer matches; an edit of the last line, or the removal of the last
// lines, passes and shows only as a different Report.Head (see the package
// documentation).
func Verify(r io.Reader) (Report, error) {
	return VerifyWith(r, VerifyOptions{})
}

// VerifyWith is Verify with o's checks: it also checks every checkpoint's
// signature (a broken one is an error wrapping ErrChainBroken and
// ErrCheckpoint), against o.Keys when set.
func VerifyWith(r io.Reader, o VerifyOptions) (Report, error) {
	rep := Report{Head: GenesisPrev}
	br := bufio.NewReaderSize(r, 64<<10)
	for n := 1; ; n++ {
		line, err := readLine(br)
		if errors.Is(err, errLineTooLong) {
			rep.BrokenLine = n
			return rep, fmt.Errorf("%w: line %d: longer than %d bytes", ErrChainBroken, n, MaxLineSize)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return rep, fmt.Errorf("audit verify: line %d: %w", n, err)
		}
		if len(line) == 0 { // clean EOF
			return rep, nil
		}
		if line[len(line)-1] != '\n' {
			rep.BrokenLine = n
			return rep, fmt.Errorf("%w: %w: line %d: %d bytes without newline (a crash in the middle of a write, or a truncated file)",
				ErrChainBroken, ErrTornLine, n, len(line))
		}
		line = line[:len(line)-1]
		rec, err := parseLine(line)
		if err != nil {
			rep.BrokenLine = n
			return rep, fmt.Errorf("%w: line %d: %w", ErrChainBroken, n, err)
		}
		if n == 1 && rec.Kind == KindRotate && rec.Seq > 1 {
			// A file that continues an earlier one: its links are
			// VerifyFiles' to check.
			rep.ContinuesSeq, rep.ContinuesHead = rec.Seq-1, rec.Prev
			rep.LastSeq, rep.Head = rec.Seq-1, rec.Prev
			if p := rec.Predecessor; p != nil {
				if p.LastSeq != rec.Seq-1 || p.Head != rec.Prev {
					rep.BrokenLine = n
					return rep, fmt.Errorf("%w: line 1: the rotate record's predecessor ends at seq %d (head %s), but its own seq and prev say seq %d (head %s)",
						ErrChainBroken, p.LastSeq, short(p.Head), rec.Seq-1, short(rec.Prev))
				}
				rep.Predecessor = p
			}
		}
		if want := rep.LastSeq + 1; rec.Seq != want {
			rep.BrokenLine = n
			return rep, fmt.Errorf("%w: line %d: seq %d, want %d (a line was removed, inserted or moved)",
				ErrChainBroken, n, rec.Seq, want)
		}
		if rec.Prev != rep.Head {
			rep.BrokenLine = n
			if n == 1 {
				return rep, fmt.Errorf("%w: line 1: prev mismatch: prev is %s, want the genesis value %s (the file does not start a chain)",
					ErrChainBroken, short(rec.Prev), short(GenesisPrev))
			}
			return rep, fmt.Errorf("%w: line %d: prev mismatch: prev is %s, want %s, the sha256 of line %d (line %d was modified, or lines were reordered)",
				ErrChainBroken, n, short(rec.Prev), short(rep.Head), n-1, n-1)
		}
		if rec.Kind == KindCheckpoint || rec.Checkpoint != nil {
			if err := checkpointOf(&rec, &rep, o.Keys); err != nil {
				rep.BrokenLine = n
				return rep, fmt.Errorf("%w: %w: line %d (seq %d): %w", ErrChainBroken, ErrCheckpoint, n, rec.Seq, err)
			}
		}
		if n == 1 {
			rep.FirstSeq, rep.FirstTime = rec.Seq, rec.Time
		}
		rep.Lines = n
		rep.LastSeq, rep.LastTime = rec.Seq, rec.Time
		rep.Head = lineHash(line)
		if rec.Kind == KindCheckpoint {
			rep.Unsigned = 0
		} else {
			rep.Unsigned++
		}
		if o.Visit != nil {
			o.Visit(&rec, rep.Head)
		}
	}
}

// checkpointOf checks checkpoint record rec (its signature, its key
// against pinned when set) and counts it in rep.
func checkpointOf(rec *Record, rep *Report, pinned []ed25519.PublicKey) error {
	if rec.Kind != KindCheckpoint {
		return fmt.Errorf("a %s record carries a checkpoint", rec.Kind)
	}
	if err := checkCheckpoint(rec); err != nil {
		return err
	}
	c := rec.Checkpoint
	if len(pinned) > 0 && !slices.ContainsFunc(pinned, func(k ed25519.PublicKey) bool { return receipt.Fingerprint(k) == c.Key }) {
		return fmt.Errorf("signed by key %s, which is not a pinned key (%s): the log was rewritten by someone with another key, or the daemon's key changed", c.Key, fingerprints(pinned))
	}
	rep.Checkpoints++
	rep.LastCheckpointSeq = rec.Seq
	i := slices.IndexFunc(rep.Keys, func(k KeyUse) bool { return k.Key == c.Key })
	if i < 0 {
		rep.Keys = append(rep.Keys, KeyUse{Key: c.Key, PublicKey: c.PublicKey, FirstSeq: rec.Seq})
		i = len(rep.Keys) - 1
	}
	rep.Keys[i].LastSeq = rec.Seq
	rep.Keys[i].Checkpoints++
	return nil
}

func fingerprints(keys []ed25519.PublicKey) string {
	var out []string
	for _, k := range keys {
		out = append(out, receipt.Fingerprint(k))
	}
	return strings.Join(out, ", ")
}

// VerifyFile runs [Verify] on the file at path.
func VerifyFile(path string) (Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return Report{Head: GenesisPrev}, fmt.Errorf("audit verify: %w", err)
	}
	defer f.Close()
	rep, err := Verify(f)
	if err != nil {
		return rep, fmt.Errorf("audit verify %s: %w", path, err)
	}
	return rep, nil
}

var errLineTooLong = errors.New("line too long")

// readLine reads up to and including the next newline, or to EOF, refusing
// lines longer than MaxLineSize. It returns io.EOF with whatever it read
// before the end. A line longer than the reader's buffer is kept in
// pieces and joined once: at most twice MaxLineSize is allocated, where
// growing one slice piece by piece took about five times the line.
func readLine(br *bufio.Reader) ([]byte, error) {
	var pieces [][]byte
	n := 0
	for {
		frag, err := br.ReadSlice('\n')
		if n+len(frag) > MaxLineSize {
			return nil, errLineTooLong
		}
		if len(pieces) == 0 && !errors.Is(err, bufio.ErrBufferFull) {
			return bytes.Clone(frag), err // the usual line, in one piece
		}
		pieces = append(pieces, bytes.Clone(frag))
		n += len(frag)
		if !errors.Is(err, bufio.ErrBufferFull) {
			return bytes.Join(pieces, nil), err
		}
	}
}

// short abbreviates a hash for error messages.
func short(s string) string {
	if len(s) > 16 {
		s = s[:16] + "…"
	}
	return fmt.Sprintf("%q", s)
}
