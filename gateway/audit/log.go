package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultSyncInterval is the fsync batching interval used when
// [Options.SyncInterval] is zero.
const DefaultSyncInterval = 100 * time.Millisecond

// DefaultRetryInterval is how often a failed Log tries to recover when
// [Options.RetryInterval] is zero.
const DefaultRetryInterval = 2 * time.Second

// ErrUnavailable is wrapped by every error of a [Log] that can no longer
// record: after a failed write or fsync, or after Close. The daemon must
// refuse new requests while [Log.Healthy] returns it.
var ErrUnavailable = errors.New("audit log unavailable")

// ErrTornLine reports a final line without its newline: the trace of a
// crash in the middle of a write, or of a truncated copy. [Open] refuses
// such a file and [Verify] reports it (together with [ErrChainBroken]).
var ErrTornLine = errors.New("torn final line")

// errClosed is the failure state of a closed Log.
var errClosed = errors.New("log closed")

// Options configures [Open].
type Options struct {
	// Path is the log file. Its directory is created 0750 and the file
	// 0640 if missing; the final element must not be a symlink.
	Path string
	// Redact holds regular expressions (RE2 syntax); every argv element
	// that any of them matches anywhere is replaced as a whole by
	// [Redacted] before the record is encoded. Anchor a pattern to match
	// whole arguments only, e.g. `^--password=`.
	Redact []string
	// SyncInterval bounds how long a written record may stay in the page
	// cache before a background fsync: zero means DefaultSyncInterval, a
	// negative value fsyncs inside every Write before it returns.
	SyncInterval time.Duration
	// Logger receives the Log's own events (open, failure); nil means
	// slog.Default().
	Logger *slog.Logger
	// RetryInterval is how often a failed Log tries to recover
	// ([Log.Recover]) on its own: zero means DefaultRetryInterval, a
	// negative value never (only explicit Recover calls).
	RetryInterval time.Duration
	// Mirror, if set, receives each record after it was written to the
	// file, redacted and with Time, Seq and Prev filled in (e.g. to send it
	// to the journal). It runs outside the Log's locks; the file stays the
	// record of truth.
	Mirror func(Record)
	// Signer, if set, signs checkpoints of the chain (checkpoint.go).
	Signer *Signer
}

// Log is an open audit log. Create it with [Open]; it is safe for
// concurrent use (see the package documentation for the lock order).
type Log struct {
	path     string
	logger   *slog.Logger
	redact   []*regexp.Regexp
	mirror   func(Record)
	interval time.Duration // < 0: fsync in Write
	retryIn  time.Duration // < 0: no automatic recovery
	now      func() time.Time

	// syncMu serialises fsync and Close. Lock order: syncMu, then mu.
	syncMu sync.Mutex

	mu     sync.Mutex
	f      file
	size   int64  // bytes of complete lines in f
	seq    uint64 // Seq of the last line, 0 for an empty file
	head   string // hash of the last line: the next line's Prev
	dirty  bool   // written since the last fsync started
	armed  bool   // timer pending
	timer  *time.Timer
	closed bool
	err    error // non-nil: failed or closed; wraps ErrUnavailable

	// synced is the length of f known to be on disk (fsynced); tail holds
	// the lines after it, as written, so that a failed fsync (whose pages
	// the kernel may have dropped) is repaired by writing them again.
	synced int64
	tail   []byte
	// The failed state: its cause, since when, whether an fsync failed
	// (the unsynced lines must then be written again), how many records
	// were refused, and the timer of the next recovery attempt.
	cause      error
	failedAt   time.Time
	syncFailed bool
	refused    int
	retry      *time.Timer
	// writeErrors counts records refused over the Log's life (metrics).
	writeErrors uint64

	// Checkpoints (checkpoint.go): the signer (nil: none), the records
	// written since the last checkpoint, the interval timer.
	signer  *signer
	sinceCP int
	cpTimer *time.Timer
}

// Open opens the audit log at opts.Path for appending, creating it if
// needed. If the file is not empty, Open reads its last line to resume Seq
// and the chain; it does not verify the rest of the file (use
// [VerifyFile]). It refuses a file whose final line is torn (wrapping
// [ErrTornLine]) or is not a valid record (wrapping [ErrChainBroken]), and
// says how to recover. It also fails on an invalid Redact pattern and, on
// Linux, when another process holds the file open through Open.
//
// Postcondition: on success the Log is healthy and holds the file lock
// until [Log.Close].
func Open(opts Options) (*Log, error) {
	return open(opts, openOS)
}

func open(opts Options, openf opener) (*Log, error) {
	if opts.Path == "" {
		return nil, errors.New("audit log: no path")
	}
	l := &Log{
		path:     opts.Path,
		logger:   opts.Logger,
		mirror:   opts.Mirror,
		interval: opts.SyncInterval,
		retryIn:  opts.RetryInterval,
		now:      time.Now,
	}
	if l.retryIn == 0 {
		l.retryIn = DefaultRetryInterval
	}
	if l.logger == nil {
		l.logger = slog.Default()
	}
	l.logger = l.logger.With("audit_log", opts.Path)
	if l.interval == 0 {
		l.interval = DefaultSyncInterval
	}
	if opts.Signer != nil {
		sg, err := newSigner(*opts.Signer)
		if err != nil {
			return nil, err
		}
		l.signer = sg
	}
	for i, p := range opts.Redact {
		re, err := regexp.Compile(p)
		if err != nil {
			return nil, fmt.Errorf("audit log: redact pattern %d: %w", i, err)
		}
		l.redact = append(l.redact, re)
	}

	f, size, err := openf(opts.Path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	seq, head, err := resume(opts.Path, f, size)
	if err != nil {
		f.Close()
		return nil, err
	}
	// What the file held at open is taken as on disk: it was written
	// by an earlier daemon whose lines are already in the chain.
	l.f, l.size, l.seq, l.head, l.synced = f, size, seq, head, size
	l.logger.Info("audit log open", "seq", seq, "head", head)
	l.armCheckpointTimer()
	return l, nil
}

// resume returns the Seq and hash of the last line of f, or 0 and
// GenesisPrev for an empty file.
func resume(path string, f io.ReaderAt, size int64) (uint64, string, error) {
	line, off, torn, err := lastLine(f, size)
	if err != nil {
		return 0, "", fmt.Errorf("audit log %s: read last line: %w", path, err)
	}
	if line == nil {
		return 0, GenesisPrev, nil
	}
	if torn {
		return 0, "", fmt.Errorf("audit log %s: %w: %d bytes at offset %d have no newline, "+
			"probably a crash in the middle of a write; inspect the fragment, "+
			"then remove it (truncate -s %d %s) or move the file aside",
			path, ErrTornLine, len(line), off, off, path)
	}
	r, err := parseLine(line)
	if err == nil && r.Seq == 0 {
		err = errors.New("seq 0")
	}
	if err != nil {
		return 0, "", fmt.Errorf("audit log %s: last line (offset %d) is not a valid record: %w: %v; "+
			"inspect the file (audit.VerifyFile checks the whole chain) and move it aside to start a new log",
			path, off, ErrChainBroken, err)
	}
	return r.Seq, lineHash(line), nil
}

// lastLine returns the last line of f (size bytes long) without its
// newline, and its offset. torn reports that the file does not end in a
// newline; line is then the fragment after the last newline. line is nil
// for an empty file.
func lastLine(f io.ReaderAt, size int64) (line []byte, off int64, torn bool, err error) {
	if size == 0 {
		return nil, 0, false, nil
	}
	var b [1]byte
	if _, err := f.ReadAt(b[:], size-1); err != nil {
		return nil, 0, false, err
	}
	end := size
	if b[0] == '\n' {
		end--
	} else {
		torn = true
	}
	const chunk = 64 << 10
	buf := make([]byte, chunk)
	start, pos := int64(0), end
	for pos > 0 {
		n := min(chunk, pos)
		if _, err := f.ReadAt(buf[:n], pos-n); err != nil {
			return nil, 0, false, err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			start = pos - n + int64(i) + 1
			break
		}
		pos -= n
		if end-pos > MaxLineSize {
			return nil, 0, false, fmt.Errorf("longer than %d bytes", MaxLineSize)
		}
	}
	line = make([]byte, end-start)
	if _, err := f.ReadAt(line, start); err != nil {
		return nil, 0, false, err
	}
	return line, start, torn, nil
}

// Write appends r to the log. It sets r.Time (now, UTC), r.Seq and r.Prev,
// ignoring the caller's values, replaces argv elements that match
// [Options.Redact] and abridges values over [MaxFieldBytes],
// [MaxArgvBytes] or [MaxArgs] (the caller's record is not modified). When Write returns
// nil the line is in the file (the page cache); it is fsynced within
// [Options.SyncInterval], or before Write returns if that is negative.
//
// An invalid Kind or Verdict, or a record longer than [MaxLineSize], is
// refused with an error and leaves the Log healthy. A failed write or fsync
// puts the Log in the failed state: the error, and that of every later
// call, wraps [ErrUnavailable] and the underlying cause. A partly written
// line is truncated away so that the file remains a valid chain.
func (l *Log) Write(r Record) error {
	_, err := l.Append(r)
	return err
}

// Entry is a record's place in the chain: its Seq and the hex SHA-256 of
// its line, which is the chain head right after it (the next record's
// Prev).
type Entry struct {
	Seq  uint64
	Hash string
}

// Append is Write that also returns where the record went: what a
// receipt of the request names.
func (l *Log) Append(r Record) (Entry, error) {
	e, cp, err := l.write(&r)
	if err != nil {
		return Entry{}, err
	}
	if l.mirror != nil {
		l.mirror(r)
		if cp != nil {
			l.mirror(*cp)
		}
	}
	return e, nil
}

// write fills in and appends r; the filled-in record is left in *r. cp is
// the checkpoint written after it, if one was due.
func (l *Log) write(r *Record) (e Entry, cp *Record, err error) {
	if !r.Kind.valid() {
		return Entry{}, nil, fmt.Errorf("audit write: invalid kind %q", r.Kind)
	}
	if r.Kind == KindCheckpoint || r.Checkpoint != nil {
		return Entry{}, nil, errors.New("audit write: checkpoints are the Log's own records")
	}
	switch r.Verdict {
	case "", VerdictAllow, VerdictDeny:
	default:
		return Entry{}, nil, fmt.Errorf("audit write: invalid verdict %q", r.Verdict)
	}
	var secrets []string
	r.Argv, secrets = l.redactArgv(r.Argv)
	r.Reason, r.Error, r.Message = l.redactText(r.Reason, secrets), l.redactText(r.Error, secrets), l.redactText(r.Message, secrets)
	bound(r)

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		if !l.closed {
			l.refused++
			l.writeErrors++
		}
		return Entry{}, nil, l.err
	}
	if err := l.appendLocked(r); err != nil {
		return Entry{}, nil, err
	}
	e = Entry{Seq: l.seq, Hash: l.head}
	if l.signer != nil && l.sinceCP >= l.signer.every {
		cp = l.checkpointLocked(fmt.Sprintf("every %d records", l.signer.every))
	}
	return e, cp, nil
}

// appendLocked encodes r as the next line and appends it. Precondition:
// l.mu is held, the Log is healthy and r is valid and redacted.
func (l *Log) appendLocked(r *Record) error {
	r.Time = l.now().UTC()
	r.Seq = l.seq + 1
	r.Prev = l.head
	if r.Kind == KindCheckpoint {
		l.signer.sign(r)
	}
	line, err := encode(r)
	if err != nil {
		return fmt.Errorf("audit write: encode: %w", err)
	}
	if len(line) > MaxLineSize {
		return fmt.Errorf("audit write: record is %d bytes, the limit is %d", len(line), MaxLineSize)
	}
	n, err := l.f.Write(line)
	if err != nil {
		l.failLocked(err)
		l.refused++
		l.writeErrors++
		if n > 0 {
			if terr := l.f.Truncate(l.size); terr != nil {
				l.logger.Error("audit log: cannot remove the partly written line; Open will refuse the file until it is removed",
					"offset", l.size, "err", terr)
			}
		}
		return l.err
	}
	l.size += int64(n)
	l.seq = r.Seq
	l.head = lineHash(line[:len(line)-1])
	l.tail = append(l.tail, line...)

	if l.interval < 0 {
		if err := l.f.Sync(); err != nil {
			// Not durable, so not accepted: the line leaves the chain,
			// and Recover writes the file again without it.
			l.tail = l.tail[:len(l.tail)-len(line)]
			l.size -= int64(n)
			l.seq, l.head = r.Seq-1, r.Prev
			l.syncFailed = true
			l.failLocked(err)
			l.refused++
			l.writeErrors++
			return l.err
		}
		l.syncedLocked(l.size)
		l.countLocked(r)
		return nil
	}
	l.countLocked(r)
	l.dirty = true
	if !l.armed {
		l.armed = true
		if l.timer == nil {
			l.timer = time.AfterFunc(l.interval, l.timedSync)
		} else {
			l.timer.Reset(l.interval)
		}
	}
	return nil
}

// RedactArgv returns a copy of argv with every element that matches one
// of [Options.Redact] replaced by [Redacted], as Write records it. It is
// the one redaction of argv: what else shows a command (the daemon's
// status of running commands) shows it through this.
func (l *Log) RedactArgv(argv []string) []string {
	out, _ := l.redactArgv(argv)
	return out
}

// redactArgv returns a copy of argv with matching elements replaced, and
// the elements it replaced.
func (l *Log) redactArgv(argv []string) (out, secrets []string) {
	if argv == nil {
		return nil, nil
	}
	out = make([]string, len(argv))
	for i, a := range argv {
		out[i] = a
		if l.secret(a) {
			out[i] = Redacted
			if a != "" {
				secrets = append(secrets, a)
			}
		}
	}
	return out, secrets
}

// secret reports whether a redact pattern matches s.
func (l *Log) secret(s string) bool {
	for _, re := range l.redact {
		if re.MatchString(s) {
			return true
		}
	}
	return false
}

// quotedRE finds Go-quoted strings (strconv.Quote), as the policy quotes
// arguments in its reasons.
var quotedRE = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// redactText removes redacted arguments from free text (a denial's reason
// quotes the argument it matched; an error may too): every occurrence of
// a secret, and every quoted string that a redact pattern matches or that
// is the start of a secret (the policy cuts long arguments when it quotes
// them).
func (l *Log) redactText(text string, secrets []string) string {
	if text == "" || len(l.redact) == 0 {
		return text
	}
	for _, sec := range secrets {
		text = strings.ReplaceAll(text, sec, Redacted)
	}
	return quotedRE.ReplaceAllStringFunc(text, func(q string) string {
		u, err := strconv.Unquote(q)
		if err != nil || u == "" {
			return q
		}
		if l.secret(u) {
			return strconv.Quote(Redacted)
		}
		for _, sec := range secrets {
			if strings.HasPrefix(sec, u) {
				return strconv.Quote(Redacted)
			}
		}
		return q
	})
}

// timedSync is the background flusher, run by the timer.
func (l *Log) timedSync() {
	l.mu.Lock()
	l.armed = false
	l.mu.Unlock()
	_ = l.Sync() // a failure is recorded in the Log and logged
}

// Sync fsyncs every record written so far. On failure the Log enters the
// failed state and the error wraps [ErrUnavailable].
func (l *Log) Sync() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()

	l.mu.Lock()
	if l.err != nil {
		defer l.mu.Unlock()
		return l.err
	}
	dirty := l.dirty
	l.dirty = false
	upto := l.size
	l.mu.Unlock()
	if !dirty {
		// Every earlier write was covered by an fsync that completed
		// before we took syncMu.
		return nil
	}

	err := l.f.Sync()
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.syncFailed = true
		l.failLocked(err)
		return l.err
	}
	l.syncedLocked(upto)
	return nil
}

// syncedLocked records that f is on disk up to upto: the lines before it
// leave the tail. Precondition: l.mu is held.
func (l *Log) syncedLocked(upto int64) {
	if upto <= l.synced {
		return
	}
	l.tail = l.tail[upto-l.synced:]
	if len(l.tail) == 0 {
		l.tail = nil // let the backing array go
	}
	l.synced = upto
}

// failLocked enters the failed state and arms the next recovery attempt.
// Precondition: l.mu is held.
func (l *Log) failLocked(err error) {
	if l.err != nil {
		return
	}
	l.err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	l.cause, l.failedAt, l.refused = err, l.now(), 0
	l.logger.Error("audit log failed; refusing further records until it recovers", "err", err, "retry_every", l.retryIn)
	l.armRetryLocked()
}

func (l *Log) armRetryLocked() {
	if l.retryIn < 0 || l.closed {
		return
	}
	if l.retry == nil {
		l.retry = time.AfterFunc(l.retryIn, l.retryRecover)
	} else {
		l.retry.Reset(l.retryIn)
	}
}

// retryRecover is the recovery timer's function.
func (l *Log) retryRecover() { _ = l.Recover() }

// Recover tries to leave the failed state, and returns nil once the Log
// records again. The lines written since the last good fsync are made
// durable: after a failed fsync they are written again from memory (the
// kernel may have dropped their pages, so the old ones are never trusted:
// the file is cut back to what was on disk first), after a failed write
// they are fsynced. Nothing that Write accepted is lost or reordered, and
// the chain goes on from the last accepted record. The first record after
// a recovery says how long the Log was unavailable, why, and how many
// records it refused meanwhile. A failed Log calls Recover on its own
// every [Options.RetryInterval].
func (l *Log) Recover() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	if l.closed || l.err == nil {
		defer l.mu.Unlock()
		return l.err
	}
	if err := l.repairLocked(); err != nil {
		l.err = fmt.Errorf("%w: %w (recovery: %w)", ErrUnavailable, l.cause, err)
		l.armRetryLocked()
		defer l.mu.Unlock()
		return l.err
	}
	cause, down, refused := l.cause, l.now().Sub(l.failedAt).Round(time.Millisecond), l.refused
	l.err, l.cause, l.syncFailed = nil, nil, false
	// The recovery record is the first line after the outage; writing it
	// is also the proof that the disk takes records again.
	r := Record{Kind: KindDaemon, Message: fmt.Sprintf("audit log recovered: unavailable for %v, %d records refused meanwhile", down, refused),
		Error: cause.Error()}
	err := l.appendLocked(&r)
	l.mu.Unlock()
	if err != nil {
		return err
	}
	l.logger.Warn("audit log recovered", "unavailable_for", down, "refused_records", refused, "cause", cause)
	if l.mirror != nil {
		l.mirror(r)
	}
	return nil
}

// repairLocked makes every accepted line durable (see Recover).
// Precondition: l.mu is held and the Log is failed.
func (l *Log) repairLocked() error {
	if l.syncFailed {
		if err := l.f.Truncate(l.synced); err != nil {
			return err
		}
		if len(l.tail) > 0 {
			n, err := l.f.Write(l.tail)
			if err != nil {
				if n > 0 {
					_ = l.f.Truncate(l.synced)
				}
				return err
			}
		}
	}
	if err := l.f.Sync(); err != nil {
		// A failed fsync taints what it covered: write it again next time.
		l.syncFailed = true
		return err
	}
	l.size = l.synced + int64(len(l.tail))
	l.syncedLocked(l.size)
	l.dirty = false
	return nil
}

// Healthy returns nil while the Log can record, and otherwise the error
// (wrapping [ErrUnavailable]) that every Write returns.
func (l *Log) Healthy() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Head returns the Seq of the last record written and the chain head: the
// hex SHA-256 of that line, which the next record's Prev will carry. For an
// empty file they are 0 and [GenesisPrev]. Logging the head elsewhere
// (journald, a remote collector) anchors the chain: a later [Report.Head]
// that does not extend it reveals a truncated or rewritten file.
func (l *Log) Head() (seq uint64, head string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq, l.head
}

// WriteErrors counts the records the Log refused since it was opened:
// write or fsync failures, and records offered while it was failed.
func (l *Log) WriteErrors() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writeErrors
}

// Close fsyncs and closes the file and releases its lock. Later Writes
// return an error wrapping [ErrUnavailable]; a second Close returns nil.
func (l *Log) Close() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	if l.err == nil && l.signer != nil && l.sinceCP > 0 {
		// A log closed cleanly ends signed.
		l.checkpointLocked("log closed")
	}
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.cpTimer != nil {
		l.cpTimer.Stop()
	}
	if l.retry != nil {
		l.retry.Stop()
	}
	var errs []error
	if err := l.f.Sync(); err != nil {
		errs = append(errs, fmt.Errorf("audit close: %w", err))
	}
	if err := l.f.Close(); err != nil {
		errs = append(errs, fmt.Errorf("audit close: %w", err))
	}
	if l.err == nil {
		l.err = fmt.Errorf("%w: %w", ErrUnavailable, errClosed)
	}
	return errors.Join(errs...)
}
