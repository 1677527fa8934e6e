package cli

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/receipt"
)

// Exit codes of vmgated receipt verify, as the receipt contract says: 0
// every receipt valid, 1 one is not (the output names what failed), 2
// an invalid command line. vmgated's other commands exit wire.ExitUsage
// (207) for the last; this one follows the convention of verifiers
// (cmp, diff, grep) so that scripts checking a published run can test
// for 1.
const (
	receiptInvalid = 1
	receiptUsage   = 2
)

func receiptCommand() *cobra.Command {
	verify := verb("verify FILE|DIR…", "Check receipts offline: signature, and record in the audit log", receiptVerifyLong, nil, receiptVerify)
	verify.Args = func(_ *cobra.Command, args []string) error {
		if len(args) == 0 {
			return exitWith(receiptUsage, errors.New("receipt verify: no receipt given (vmgated receipt verify FILE|DIR… [--key PUB] [--audit FILE|DIR])"))
		}
		return nil
	}
	verify.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return exitWith(receiptUsage, fmt.Errorf("receipt verify: %v (vmgated receipt verify --help)", err))
	})
	return group("receipt", "Receipts: the daemon's signing key, and checking receipts offline",
		verb("key", "Print the receipt signing key's public half and fingerprint", receiptKeyLong, cobra.NoArgs, receiptKey),
		verify)
}

const receiptKeyLong = `Prints the fingerprint of the key that signs receipts and the audit log's checkpoints,
then its public half as a PEM block: save the output as a file for vmgated receipt verify
--key and vmgated audit verify --key. It reads STATE/receipt.pub, written beside the key.`

const receiptVerifyLong = `Checks each receipt (a file, or every *.receipt and *.receipt.json file under a directory):
its signature under --key (default: the local daemon's STATE/receipt.pub; without either it
refuses), and with --audit that the audit log holds the receipt's record at its sequence
number with its hash, request id and stream hashes, that the chain is intact up to it
(rotated files too), that its checkpoints are signed by the same key, and that the chain
head it saw is there. A key named in the audit log is never trusted: whoever can write the
log can name their own. Exit status: 0 all valid, 1 one is not (the output names what
failed), 2 an invalid command line or no key.`

func receiptKey(fs *pflag.FlagSet) runFunc {
	state := fs.String("state-dir", receiptStateDir(), "state directory (the key is STATE/"+receipt.DefaultKeyFile+")")
	keyPath := fs.String("key", "", "the signing key's file, as vmgated serve --receipt-key (its public half is beside it)")
	asJSON := fs.Bool("json", false, "print fingerprint and public key as JSON")
	return func(_ context.Context, _ []string) error {
		path := *keyPath
		if path == "" {
			if err := needStateDir(*state); err != nil {
				return err
			}
			path = filepath.Join(*state, receipt.DefaultKeyFile)
		}
		pub, err := receipt.ReadPublicKey(receipt.PublicPath(path))
		if errors.Is(err, iofs.ErrNotExist) {
			// The daemon writes the public half at start; the private key
			// gives it too (to its owner).
			var k ed25519.PrivateKey
			if k, err = receipt.LoadKey(path); err == nil {
				pub = k.Public().(ed25519.PublicKey)
			}
		}
		if err != nil {
			return fmt.Errorf("%w (the daemon creates the key at its first start)", err)
		}
		pemText := string(receipt.MarshalPublicKey(pub))
		if *asJSON {
			return json.NewEncoder(os.Stdout).Encode(map[string]string{"fingerprint": receipt.Fingerprint(pub), "public_key": pemText,
				"key_file": path, "public_key_file": receipt.PublicPath(path)})
		}
		fmt.Printf("%s receipt signing key of vmgated (%s)\n%s", receipt.Fingerprint(pub), path, pemText)
		return nil
	}
}

// receiptStateDir is the default state directory of the receipt
// commands: the installed daemon's when its public key is readable there
// (any user may read it), else defaultStateDir.
func receiptStateDir() string {
	if _, err := os.Stat(filepath.Join(SystemStateDir, receipt.PublicPath(receipt.DefaultKeyFile))); err == nil {
		return SystemStateDir
	}
	return defaultStateDir()
}

// receiptResult is one receipt of `vmgated receipt verify --json`.
type receiptResult struct {
	File      string `json:"file"`
	Valid     bool   `json:"valid"`
	Error     string `json:"error,omitempty"`
	RequestID string `json:"request_id,omitempty"`
	Key       string `json:"key,omitempty"`
	Verdict   string `json:"verdict,omitempty"`
	AuditSeq  uint64 `json:"audit_seq,omitempty"`
	// AuditChecked says the record was found in the given log.
	AuditChecked bool `json:"audit_checked"`
}

func receiptVerify(fs *pflag.FlagSet) runFunc {
	var keys, logs []string
	fs.StringArrayVar(&keys, "key", nil, "public key `PUB` (PEM, as vmgated receipt key prints it) the receipts must be signed by (repeatable; default STATE/receipt.pub)")
	fs.StringArrayVar(&logs, "audit", nil, "audit log `FILE` or directory of rotated files to find the receipts' records in (repeatable)")
	state := fs.String("state-dir", receiptStateDir(), "state directory whose receipt.pub is the default key")
	asJSON := fs.Bool("json", false, "print one result per receipt as JSON")
	return func(_ context.Context, args []string) error {
		rv, err := newReceiptVerifier(keys, logs, *state)
		if err != nil {
			return exitWith(receiptUsage, err)
		}
		files, err := receiptFiles(args)
		if err != nil {
			return exitWith(receiptUsage, err)
		}
		results := rv.verify(files)
		if *asJSON {
			if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
				return err
			}
		} else {
			writeReceiptResults(os.Stdout, rv, results)
		}
		for _, r := range results {
			if !r.Valid {
				return exitWith(receiptInvalid, nil)
			}
		}
		if len(results) == 0 {
			return exitWith(receiptInvalid, errors.New("receipt verify: no receipts found"))
		}
		return nil
	}
}

// receiptFiles expands the arguments: a file is itself, a directory its
// *.receipt and *.receipt.json files, recursively, in lexical order.
func receiptFiles(args []string) ([]string, error) {
	var out []string
	for _, a := range args {
		fi, err := os.Stat(a)
		if err != nil {
			return nil, fmt.Errorf("receipt verify: %w", err)
		}
		if !fi.IsDir() {
			out = append(out, a)
			continue
		}
		err = filepath.WalkDir(a, func(p string, d iofs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.Type().IsRegular() && (strings.HasSuffix(p, ".receipt") || strings.HasSuffix(p, ".receipt.json")) {
				out = append(out, p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("receipt verify: %w", err)
		}
	}
	return out, nil
}

// receiptVerifier checks receipts against keys and, when given, the
// audit log.
type receiptVerifier struct {
	keys      []ed25519.PublicKey
	keySource string // where the keys came from, for the output
	logs      []string
	// The audit log's index, built on first use: the intact records by
	// Seq with their line hashes, its range, and why the chain ends early
	// (nil: intact to its end; a checkpoint by a key other than keys
	// ends it).
	indexed  bool
	records  map[uint64]auditLine
	first    uint64
	last     uint64
	chainErr error
}

type auditLine struct {
	rec  audit.Record
	hash string
}

func newReceiptVerifier(keyFiles, logs []string, state string) (*receiptVerifier, error) {
	rv := &receiptVerifier{logs: logs}
	for _, f := range keyFiles {
		k, err := receipt.ReadPublicKey(f)
		if err != nil {
			return nil, fmt.Errorf("receipt verify: --key: %w", err)
		}
		rv.keys = append(rv.keys, k)
	}
	if len(rv.keys) > 0 {
		rv.keySource = "--key"
		return rv, nil
	}
	// The local daemon's key, never one an audit log names: who can
	// write the log (a collector, a backup, a copy shipped off the host:
	// those checkpoints defend against) can write a checkpoint and a
	// record under a key of their own, and sign a receipt with it.
	const noKey = "receipt verify: no key to verify against: pass --key PUB (vmgated receipt key prints the daemon's; a key an audit log names is not trusted)"
	if state == "" {
		return nil, errors.New(noKey + " (no state directory for the local " + receipt.PublicPath(receipt.DefaultKeyFile) + ")")
	}
	def := filepath.Join(state, receipt.PublicPath(receipt.DefaultKeyFile))
	k, err := receipt.ReadPublicKey(def)
	if err != nil {
		return nil, fmt.Errorf("%s (%w)", noKey, err)
	}
	rv.keys, rv.keySource = []ed25519.PublicKey{k}, def
	return rv, nil
}

// verify checks each file.
func (rv *receiptVerifier) verify(files []string) []receiptResult {
	out := []receiptResult{}
	for _, f := range files {
		out = append(out, rv.one(f))
	}
	return out
}

func (rv *receiptVerifier) one(file string) receiptResult {
	r := receiptResult{File: file}
	fail := func(err error) receiptResult {
		r.Error = err.Error()
		return r
	}
	doc, err := readReceipt(file)
	if err != nil {
		return fail(err)
	}
	if len(rv.logs) > 0 {
		if err := rv.index(); err != nil {
			return fail(err)
		}
	}
	b, err := receipt.Verify(doc, rv.keys...)
	if err != nil {
		return fail(err)
	}
	r.RequestID, r.Key, r.Verdict = b.RequestID, b.Key, b.Verdict
	if b.Audit != nil {
		r.AuditSeq = b.Audit.Seq
	}
	if len(rv.logs) > 0 {
		if err := rv.checkRecord(b); err != nil {
			return fail(err)
		}
		r.AuditChecked = true
	}
	r.Valid = true
	return r
}

// readReceipt reads a receipt file (at most receipt.MaxSize, one
// trailing newline allowed).
func readReceipt(file string) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	doc, err := io.ReadAll(io.LimitReader(f, receipt.MaxSize+2))
	if err != nil {
		return nil, err
	}
	doc, _ = bytes.CutSuffix(doc, []byte("\n"))
	return doc, nil
}

// index reads the audit log once: every intact record, its checkpoints
// pinned to rv.keys.
func (rv *receiptVerifier) index() error {
	if rv.indexed {
		return rv.chainErrIfEmpty()
	}
	rv.indexed = true
	rv.records = map[uint64]auditLine{}
	_, err := audit.VerifyFilesWith(audit.VerifyOptions{Keys: rv.keys, Visit: func(r *audit.Record, hash string) {
		rv.records[r.Seq] = auditLine{rec: *r, hash: hash}
		if rv.first == 0 {
			rv.first = r.Seq
		}
		rv.last = r.Seq
	}}, rv.logs...)
	rv.chainErr = err
	return rv.chainErrIfEmpty()
}

// chainErrIfEmpty is the log's own error when it yields nothing at all.
func (rv *receiptVerifier) chainErrIfEmpty() error {
	if len(rv.records) == 0 {
		if rv.chainErr != nil {
			return fmt.Errorf("audit log: %w", rv.chainErr)
		}
		return errors.New("audit log: no records")
	}
	return nil
}

// checkRecord checks b against the audit log's record it names and the
// chain head it saw.
func (rv *receiptVerifier) checkRecord(b *receipt.Body) error {
	a := b.Audit
	if a == nil {
		return fmt.Errorf("the receipt names no audit record (%s)", b.AuditNote)
	}
	if err := rv.lineAt(a.Seq, a.Hash, "its record"); err != nil {
		return err
	}
	line := rv.records[a.Seq]
	rec := line.rec
	want := audit.KindExec
	if b.Verdict == receipt.VerdictDeny {
		want = audit.KindDecision
	}
	switch {
	case rec.RequestID != b.RequestID:
		return fmt.Errorf("audit record at seq %d is request %q's, not %q's", a.Seq, rec.RequestID, b.RequestID)
	case rec.Kind != want:
		return fmt.Errorf("audit record at seq %d is a %s record, the receipt names a %s record", a.Seq, rec.Kind, want)
	case want == audit.KindExec && (rec.StdoutSHA256 != b.Stdout.SHA256 || rec.StderrSHA256 != b.Stderr.SHA256 || rec.StdinSHA256 != b.Stdin.SHA256):
		return fmt.Errorf("audit record at seq %d has other stream hashes than the receipt", a.Seq)
	}
	return rv.lineAt(a.HeadSeq, a.Head, "the chain head it saw")
}

// lineAt checks that the log holds a line at seq with hash.
func (rv *receiptVerifier) lineAt(seq uint64, hash, what string) error {
	line, ok := rv.records[seq]
	switch {
	case ok && line.hash == hash:
		return nil
	case ok:
		return fmt.Errorf("%s: the audit log's line at seq %d has hash %.16s…, the receipt says %.16s…: the log or the receipt was changed, or they are different daemons'", what, seq, line.hash, hash)
	case rv.chainErr != nil && seq > rv.last:
		return fmt.Errorf("%s: seq %d is past where the audit chain breaks (intact to seq %d): %v", what, seq, rv.last, rv.chainErr)
	case seq > rv.last:
		return fmt.Errorf("%s: seq %d is not in the given audit log (it ends at seq %d): the log was truncated, or it is not this daemon's", what, seq, rv.last)
	default:
		return fmt.Errorf("%s: seq %d is not in the given audit log (it starts at seq %d): give the earlier, rotated files too", what, seq, rv.first)
	}
}

// writeReceiptResults prints one line per receipt.
func writeReceiptResults(w io.Writer, rv *receiptVerifier, results []receiptResult) {
	for _, r := range results {
		if !r.Valid {
			fmt.Fprintf(w, "%s: INVALID: %s\n", r.File, r.Error)
			continue
		}
		how := "signature by " + r.Key + " (key from " + rv.keySource + ")"
		if r.AuditChecked {
			how += fmt.Sprintf("; audit record seq %d found, chain intact up to it", r.AuditSeq)
		}
		fmt.Fprintf(w, "%s: valid: request %s, %s; %s\n", r.File, r.RequestID, r.Verdict, how)
	}
	if rv.indexed && rv.chainErr != nil {
		fmt.Fprintf(w, "note: the audit log is not intact beyond seq %d: %v\n", rv.last, rv.chainErr)
	}
}
