package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Bounds on what one record may carry from a client or a guest. A value
// over its bound is cut and marked with its full length and SHA-256, so
// that a record stays small (a few tens of KiB, however hostile the input)
// and the full value can still be matched against it.
const (
	// MaxFieldBytes bounds each string field and each argv element.
	MaxFieldBytes = 1024
	// MaxArgvBytes bounds the bytes of argv's elements together.
	MaxArgvBytes = 16 << 10
	// MaxArgs bounds the number of argv elements kept.
	MaxArgs = 256
	// MaxTransfers bounds the transfers one record lists, and
	// MaxTransfersBytes the bytes of their strings together (each string
	// abridged first); those after the first over either bound are left
	// out and counted in Record.TransfersOmitted.
	MaxTransfers      = 64
	MaxTransfersBytes = 32 << 10
)

// abridge returns s, or its first MaxFieldBytes bytes (valid UTF-8)
// followed by a mark with the full length and hash.
func abridge(s string) string {
	if len(s) <= MaxFieldBytes {
		return s
	}
	return strings.ToValidUTF8(s[:MaxFieldBytes], "\uFFFD") + mark(len(s), sha256.Sum256([]byte(s)))
}

func mark(n int, sum [32]byte) string {
	return fmt.Sprintf("…[abridged: %d bytes, sha256:%s]", n, hex.EncodeToString(sum[:]))
}

// abridgeArgv bounds argv: each element as abridge does, at most MaxArgs
// elements and MaxArgvBytes bytes kept; what is left out is replaced by
// one last element that counts it and carries the SHA-256 of the whole
// argv (its elements each followed by a NUL byte).
func abridgeArgv(argv []string) []string {
	total := 0
	for _, a := range argv {
		total += len(a)
	}
	if total <= MaxArgvBytes && len(argv) <= MaxArgs && !anyLonger(argv, MaxFieldBytes) {
		return argv
	}
	out := make([]string, 0, min(len(argv), MaxArgs)+1)
	used := 0
	for i, a := range argv {
		a = abridge(a)
		if i >= MaxArgs-1 || used+len(a) > MaxArgvBytes {
			h := sha256.New()
			for _, a := range argv {
				h.Write([]byte(a))
				h.Write([]byte{0})
			}
			var sum [32]byte
			h.Sum(sum[:0])
			out = append(out, fmt.Sprintf("…[%d more arguments; argv: %d arguments, %d bytes, sha256:%s]",
				len(argv)-i, len(argv), total, hex.EncodeToString(sum[:])))
			break
		}
		out = append(out, a)
		used += len(a)
	}
	return out
}

func anyLonger(ss []string, n int) bool {
	for _, s := range ss {
		if len(s) > n {
			return true
		}
	}
	return false
}

// bound abridges every string field of r: a client or a guest can fill
// most of them, and none needs more room.
func bound(r *Record) {
	r.Argv = abridgeArgv(r.Argv)
	r.EnvNames = abridgeArgv(r.EnvNames)
	for _, f := range []*string{&r.Dir, &r.RequestID, &r.User, &r.Profile, &r.Session, &r.Rule, &r.Reason, &r.VMID,
		&r.ImageDigest, &r.ImageManifestDigest, &r.Signal, &r.StdoutSHA256, &r.StderrSHA256, &r.VMStart, &r.Error, &r.Message} {
		*f = abridge(*f)
	}
	if s := r.SSH; s != nil {
		c := *s
		c.Fingerprint, c.Comment, c.User, c.Remote = abridge(c.Fingerprint), abridge(c.Comment), abridge(c.User), abridge(c.Remote)
		r.SSH = &c
	}
	r.Transfers, r.TransfersOmitted = boundTransfers(r.Transfers, r.TransfersOmitted)
	if n := r.Net; n != nil {
		c := *n
		c.Proto, c.Name, c.Addr = abridge(c.Proto), abridge(c.Name), abridge(c.Addr)
		r.Net = &c
	}
}

// boundTransfers returns the first of ts, each string field abridged,
// while they number at most MaxTransfers and their strings take at most
// MaxTransfersBytes, and omitted plus the number left out. ts is not
// changed.
func boundTransfers(ts []Transfer, omitted int) ([]Transfer, int) {
	if len(ts) == 0 {
		return ts, omitted
	}
	out := make([]Transfer, 0, min(len(ts), MaxTransfers))
	used := 0
	for i, t := range ts {
		t.Direction, t.Guest, t.Local = abridge(t.Direction), abridge(t.Guest), abridge(t.Local)
		t.SHA256, t.FileSHA256, t.Error = abridge(t.SHA256), abridge(t.FileSHA256), abridge(t.Error)
		used += len(t.Direction) + len(t.Guest) + len(t.Local) + len(t.SHA256) + len(t.FileSHA256) + len(t.Error)
		if i >= MaxTransfers || used > MaxTransfersBytes {
			return out, omitted + len(ts) - i
		}
		out = append(out, t)
	}
	return out, omitted
}
