package integrity

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestFileMAC: a whole file's keyed check does not depend on how its
// bytes are written (in one piece, across chunks, byte by byte), and
// changes with a byte, a cut, an added byte, the key and the domain.
func TestFileMAC(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 3*fileChunk+1234)
	for i := range data {
		data[i] = byte(rnd.Uint32())
	}
	key := bytes.Repeat([]byte{1}, KeySize)
	sum := func(key []byte, d Domain, b []byte, pieces ...int) string {
		t.Helper()
		m, err := NewFileMAC(key, d)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range pieces {
			n = min(n, len(b))
			_, _ = m.Write(b[:n])
			b = b[n:]
		}
		_, _ = m.Write(b)
		return m.Sum()
	}
	whole := sum(key, DomainState, data)
	ones := make([]int, 2000)
	for i := range ones {
		ones[i] = 1
	}
	for name, got := range map[string]string{
		"across chunks": sum(key, DomainState, data, 100, fileChunk, 3, fileChunk-2, 5),
		"byte by byte":  sum(key, DomainState, data, ones...),
	} {
		if got != whole {
			t.Errorf("%s: %s, want %s", name, got, whole)
		}
	}
	if got, err := ReaderMAC(bytes.NewReader(data), key, DomainState); err != nil || got != whole {
		t.Errorf("ReaderMAC: %s %v, want %s", got, err, whole)
	}
	changed := bytes.Clone(data)
	changed[2*fileChunk+7] ^= 1
	for name, got := range map[string]string{
		"a byte changed": sum(key, DomainState, changed),
		"cut":            sum(key, DomainState, data[:len(data)-1]),
		"a byte added":   sum(key, DomainState, append(bytes.Clone(data), 0)),
		"another key":    sum(bytes.Repeat([]byte{2}, KeySize), DomainState, data),
		"another domain": sum(key, DomainOverlay, data),
	} {
		if got == whole {
			t.Errorf("%s: the same check", name)
		}
	}
	if _, err := NewFileMAC(key[:16], DomainState); err == nil {
		t.Error("a key of 16 bytes was taken")
	}
}
