// Package audit writes and verifies vmgated's audit log: one JSON object per
// line (JSON Lines), one [Record] per policy decision, command execution,
// session event or daemon event, each line chained to the one before it by a
// SHA-256 hash.
//
// [Open] opens (or creates) the log, [Log.Write] appends a record and
// [Verify] / [VerifyFile] check a log offline. A record's Prev field holds
// the hex SHA-256 of the exact bytes of the previous line without its
// newline; the first line of every file carries [GenesisPrev], the SHA-256 of
// the empty string, and has Seq 1. Seq grows by exactly one per line.
//
// # Fail closed, then recover
//
// vmgated must not run what it cannot audit. When a write or an fsync fails
// (a full disk, an I/O error) the [Log] enters the failed state: every
// later [Log.Write] and [Log.Healthy] returns an error wrapping
// [ErrUnavailable], for example
//
//	audit log unavailable: write /var/lib/vmgate/audit.jsonl: no space left on device
//
// and the daemon refuses new requests with that message. Every
// [Options.RetryInterval] (default 2 s) the Log tries to recover
// ([Log.Recover]): once the disk takes records again it makes every
// accepted line durable, writes a daemon record saying how long it was
// unavailable, why and how many records it refused, and records again; no
// restart is needed. Nothing that Write accepted is lost or reordered, and
// the chain goes on. A failed fsync is never simply retried, because after
// one the kernel may already have dropped the dirty pages (the "fsyncgate"
// finding, https://wiki.postgresql.org/wiki/Fsync_Errors): the Log keeps the
// lines written since the last good fsync in memory, cuts the file back to
// what was on disk, writes them again and fsyncs that. With a negative
// SyncInterval a record whose fsync failed is not accepted (Write returns
// the error) and leaves the chain.
//
// # Durability
//
// Records are written with one write(2) each on an O_APPEND descriptor, so a
// record reaches the page cache before Write returns; a background timer
// fsyncs at most [Options.SyncInterval] later. A crash of the daemon loses
// nothing that Write accepted; a crash of the host may lose the records of
// the last interval, and may leave a torn final line, which [Open] refuses
// with instructions (see [ErrTornLine]).
//
// # Threat model
//
// The daemon is the only writer. Guests and API clients never write the log:
// they only supply field values, which are JSON-encoded (so they cannot
// inject lines), and argv is redacted by [Options.Redact] before encoding.
//
// The hash chain is unkeyed. It detects accidental corruption and any edit,
// deletion, insertion or reordering of lines inside a file by someone who
// does not also rewrite every later line. It does not detect truncation of
// the tail (dropping the last lines leaves a valid shorter chain), nor the
// replacement of the whole file, or of everything after some line, by
// someone who can write the file: such a person can recompute the chain.
// Both become detectable against an anchor kept elsewhere: [Log.Head]
// returns the current sequence number and chain head, which the daemon
// should periodically log to journald or ship to a collector, and a later
// [Report.Head] must then extend it. Deployments that need real tamper
// resistance should ship the log off-host as it is written, and may set the
// append-only attribute (chattr +a) on the file so that even root must first
// clear it, leaving a trace, before rewriting history.
//
// Rotation never replaces a file: [Log.Rotate] picks a name that is free
// and moves the log there with rename(2)'s RENAME_NOREPLACE, so that two
// rotations within one second (one name per second) cannot move the second
// file onto the first and erase its history (issue 30, finding 5). Each
// rotated file starts with a KindRotate record naming the file it
// continues ([Predecessor]); [VerifyFiles] names a missing one. Rotating
// is the right of root, vmgated's user and profiles with audit_rotate,
// not of every caller. A missing oldest file is reported, not refused:
// retention removes it as well, and only the operator knows how many
// files should be kept.
//
// # Signed checkpoints
//
// With [Options.Signer] the Log appends checkpoint records
// (checkpoint.go) that sign the chain head with the daemon's receipt key
// (package receipt): every [Signer.Every] records, at least every
// [Signer.Interval] while records come, at both ends of a rotation, at a
// clean close, and when the daemon starts ([Log.Checkpoint]), so that the
// chain names the key of every run. [VerifyWith] checks each signature;
// [VerifyOptions.Keys] pins the keys it accepts. What this adds, against
// whom:
//
//   - Someone who can write the log but cannot read the key (a log
//     collector, a backup, another user given write access, a copy
//     shipped off the host) can no longer rewrite history and recompute
//     the chain: every checkpoint after the change fails, and a log whose
//     checkpoints were removed, or made with another key, fails against
//     the pinned key.
//   - Records after the last checkpoint are not signed yet ([Report]
//     counts them as Unsigned): they can be cut or changed like an
//     unkeyed chain's tail. A log closed cleanly ends with a checkpoint.
//   - Root on the host, or anyone who can read the key file (the daemon's
//     user), can sign anything: against them checkpoints prove nothing
//     about what is on the disk now. What holds against them is what left
//     the host earlier: a receipt a caller kept names a record's sequence
//     number and hash and the chain head (package receipt), and a log
//     rewritten at or before that point no longer matches it; so do heads
//     or checkpoints shipped to a collector. Keep the key readable by the
//     daemon's user only, and ship the log off-host as it is written.
//
// Redaction covers argv and what quotes it: in Reason, Error and Message
// every redacted argument, and every quoted string that a pattern matches
// or that starts a redacted argument, is replaced too (a denial's reason
// quotes the argument it matched, cut when long). Other text is written as
// given, so callers must not copy secrets into it. Every string field is
// bounded ([MaxFieldBytes], [MaxArgvBytes], [MaxArgs]): a longer value is
// cut and marked with its full length and SHA-256.
//
// # Locking
//
// A Log is safe for concurrent use. It holds two mutexes, always taken in
// this order: syncMu (serialises fsync and Close) before mu (guards the file
// offset, sequence number, chain head and failure state). write(2) runs
// under mu; fsync runs under syncMu only, so writers do not wait for the
// disk. On Linux, Open also takes an exclusive flock(2) on the file, so a
// second daemon cannot interleave its own chain.
package audit
