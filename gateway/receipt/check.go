package receipt

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sync"
)

// The client's side: it hashes the streams it received (and sent) itself
// and refuses a receipt that disagrees with them.

// ErrMismatch is wrapped by Check's errors: the receipt says other than
// what the client received.
var ErrMismatch = errors.New("receipt disagrees with what the client received")

// MaxStdinHead is how much of its stdin a client keeps to check a
// command that read only part of it (Received.StdinHead).
const MaxStdinHead = 1 << 20

// Received is what a client saw of one command.
type Received struct {
	RequestID      string
	Stdout, Stderr Stream
	// StdinSent is what the client sent as stdin (zero without stdin);
	// StdinHead its first bytes, up to MaxStdinHead.
	StdinSent Stream
	StdinHead []byte
	// Outcome is what the result reported; nil when there is none (a
	// refusal, a failure): the receipt's outcome is then not compared.
	Outcome *Outcome
}

// Outcome is how a command ended, as its result reported it.
type Outcome struct {
	ExitCode int
	Signal   string
	TimedOut bool
}

// Check compares the receipt's body with what the client received: the
// request id, stdout and stderr (count and hash), the outcome (when the
// client has one), and stdin:
// the command may have read less than was sent, so the daemon's count
// must not exceed the client's, and its hash must be that of as many
// bytes of what was sent. When the command read part of a stdin longer
// than MaxStdinHead that part's hash cannot be checked: Check returns a
// note saying so. Errors wrap ErrMismatch.
func (b *Body) Check(r Received) (notes []string, err error) {
	var bad []string
	if r.RequestID != "" && b.RequestID != r.RequestID {
		bad = append(bad, fmt.Sprintf("request id %q, the result's is %q", b.RequestID, r.RequestID))
	}
	for _, s := range []struct {
		name      string
		got, said Stream
	}{{"stdout", r.Stdout, b.Stdout}, {"stderr", r.Stderr, b.Stderr}} {
		if s.got != s.said {
			bad = append(bad, fmt.Sprintf("%s: the receipt says %d bytes (sha256 %.12s…), the client received %d (sha256 %.12s…)",
				s.name, s.said.Bytes, s.said.SHA256, s.got.Bytes, s.got.SHA256))
		}
	}
	if o := r.Outcome; o != nil && (b.ExitCode == nil || *b.ExitCode != o.ExitCode || b.Signal != o.Signal || b.TimedOut != o.TimedOut) {
		code := "none"
		if b.ExitCode != nil {
			code = fmt.Sprint(*b.ExitCode)
		}
		bad = append(bad, fmt.Sprintf("outcome: the receipt says exit %s signal %q timed out %v, the result exit %d signal %q timed out %v",
			code, b.Signal, b.TimedOut, o.ExitCode, o.Signal, o.TimedOut))
	}
	in, sent := b.Stdin, r.StdinSent
	if sent.SHA256 == "" {
		sent = Stream{SHA256: EmptySHA256}
	}
	switch {
	case in.Bytes > sent.Bytes:
		bad = append(bad, fmt.Sprintf("stdin: the receipt says the command read %d bytes, the client sent %d", in.Bytes, sent.Bytes))
	case in.Bytes == sent.Bytes:
		if in.SHA256 != sent.SHA256 {
			bad = append(bad, fmt.Sprintf("stdin: the receipt's sha256 %.12s… is not that of the %d bytes sent (%.12s…)", in.SHA256, sent.Bytes, sent.SHA256))
		}
	case in.Bytes <= int64(len(r.StdinHead)):
		if want := StreamOf(r.StdinHead[:in.Bytes]); in != want {
			bad = append(bad, fmt.Sprintf("stdin: the receipt's sha256 %.12s… is not that of the first %d bytes sent (%.12s…)", in.SHA256, in.Bytes, want.SHA256))
		}
	default:
		notes = append(notes, fmt.Sprintf("stdin: the command read %d of the %d bytes sent; the hash of that part was not checked (the client keeps the first %d)", in.Bytes, sent.Bytes, MaxStdinHead))
	}
	if len(bad) > 0 {
		return notes, fmt.Errorf("%w: %s", ErrMismatch, joinSemi(bad))
	}
	return notes, nil
}

func joinSemi(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += "; "
		}
		out += x
	}
	return out
}

// Hasher counts and hashes what is written to it and passes it on to W
// (nil: nowhere); a write error of W is returned after the bytes were
// counted. It is safe for concurrent use.
type Hasher struct {
	W  io.Writer
	mu sync.Mutex
	h  hash.Hash
	n  int64
}

// Write implements io.Writer.
func (h *Hasher) Write(p []byte) (int, error) {
	h.mu.Lock()
	if h.h == nil {
		h.h = sha256.New()
	}
	h.h.Write(p)
	h.n += int64(len(p))
	h.mu.Unlock()
	if h.W == nil {
		return len(p), nil
	}
	return h.W.Write(p)
}

// Stream is what was written so far.
func (h *Hasher) Stream() Stream {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.h == nil {
		return Stream{SHA256: EmptySHA256}
	}
	return Stream{Bytes: h.n, SHA256: hex.EncodeToString(h.h.Sum(nil))}
}

// SentReader counts, hashes and keeps the first MaxStdinHead bytes of
// what is read through it: a client's record of the stdin it sent.
type SentReader struct {
	R    io.Reader
	mu   sync.Mutex
	h    Hasher
	head []byte
}

// Read implements io.Reader.
func (s *SentReader) Read(p []byte) (int, error) {
	n, err := s.R.Read(p)
	if n > 0 {
		s.mu.Lock()
		_, _ = s.h.Write(p[:n])
		if room := MaxStdinHead - len(s.head); room > 0 {
			s.head = append(s.head, p[:min(room, n)]...)
		}
		s.mu.Unlock()
	}
	return n, err
}

// Sent returns what was read so far and its first bytes.
func (s *SentReader) Sent() (Stream, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.h.Stream(), s.head
}
