package migstream

// The stream's fields: read bounded from the stream, written to the
// state passed on, which is bounded too.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Readers of the stream's big-endian fields; a stream that ends early is
// an error.

func (s *splitter) bytes(n int) ([]byte, error) {
	b, err := s.in.Peek(n)
	if err != nil {
		return nil, s.readErr(err)
	}
	_, _ = s.in.Discard(n)
	s.pos += int64(n)
	return b, nil
}

func (s *splitter) u8() (byte, error) {
	b, err := s.in.ReadByte()
	if err != nil {
		return 0, s.readErr(err)
	}
	s.pos++
	return b, nil
}

func (s *splitter) u32() (uint32, error) {
	b, err := s.bytes(4)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b), nil
}

func (s *splitter) u64() (uint64, error) {
	b, err := s.bytes(8)
	if err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b), nil
}

// str reads a string: a length byte, then as many bytes.
func (s *splitter) str() (string, error) {
	n, err := s.u8()
	if err != nil {
		return "", err
	}
	b, err := s.bytes(int(n))
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func (s *splitter) readErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return s.errorf("the stream ends early")
	}
	return fmt.Errorf("migstream: read: %w", err)
}

// limitWriter passes on at most n bytes; its first error sticks.
type limitWriter struct {
	w       io.Writer
	n       int64
	written int64
	err     error
	buf     [8]byte
}

// ErrStateTooBig reports a stream whose state is over Options.MaxState.
var ErrStateTooBig = errors.New("migstream: the device state is larger than allowed")

func (l *limitWriter) Write(p []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	if l.written+int64(len(p)) > l.n {
		l.err = fmt.Errorf("%w (%d bytes)", ErrStateTooBig, l.n)
		return 0, l.err
	}
	n, err := l.w.Write(p)
	l.written += int64(n)
	if err != nil {
		l.err = fmt.Errorf("migstream: write state: %w", err)
	}
	return n, l.err
}

func (l *limitWriter) write(p []byte) { _, _ = l.Write(p) }
func (l *limitWriter) u8(v byte)      { l.buf[0] = v; l.write(l.buf[:1]) }
func (l *limitWriter) u32(v uint32) {
	binary.BigEndian.PutUint32(l.buf[:4], v)
	l.write(l.buf[:4])
}

func (l *limitWriter) u64(v uint64) {
	binary.BigEndian.PutUint64(l.buf[:8], v)
	l.write(l.buf[:8])
}

func (l *limitWriter) str(v string) {
	l.u8(byte(len(v)))
	l.write([]byte(v))
}
