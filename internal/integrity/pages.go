package integrity

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
)

// PageDigest digests a RAM image by its pages that are not all zeros:
// SHA-256 over each one's offset (8 bytes, big-endian) and content, in
// the order of their offsets. Zero pages, whether holes or written, do
// not count, so the digest names the content whatever the layout of the
// file holding it. It may take, or take instead, a keyed check of the
// same pages (NewPageCheck): each page a chunk of a MAC at its offset.
type PageDigest struct {
	h    hash.Hash // nil: no SHA-256
	mac  *MAC      // nil: no keyed check
	next int64
	hdr  [8]byte
}

// NewPageDigest returns an empty digest (SHA-256: Sum).
func NewPageDigest() *PageDigest { return &PageDigest{h: sha256.New()} }

// NewPageCheck returns an empty keyed check of the pages (MAC, under key
// in DomainRAM: PageDigest.MAC) and, with digest, their SHA-256 too
// (Sum).
func NewPageCheck(key []byte, digest bool) (*PageDigest, error) {
	mac, err := NewMAC(key, DomainRAM)
	if err != nil {
		return nil, err
	}
	d := &PageDigest{mac: mac}
	if digest {
		d.h = sha256.New()
	}
	return d, nil
}

// Add adds the pages of p, which starts at offset off (page-aligned, not
// before the end of what was added before; p a whole number of pages).
func (d *PageDigest) Add(off int64, p []byte) error {
	if off%PageSize != 0 || len(p)%PageSize != 0 || off < d.next {
		return fmt.Errorf("integrity: digest: %d bytes at %#x after %#x", len(p), off, d.next)
	}
	for i := 0; i < len(p); i += PageSize {
		if pg := p[i : i+PageSize]; !IsZeroPage(pg) {
			d.add(off+int64(i), pg)
		}
	}
	d.next = off + int64(len(p))
	return nil
}

// AddPage adds one page at offset off (page-aligned, not before the end
// of what was added before), for a reader that has already found that it
// is not all zeros.
//
// Precondition: page is not all zeros (IsZeroPage): Add leaves those
// out, and AddPage does not look again.
func (d *PageDigest) AddPage(off int64, page []byte) error {
	if off%PageSize != 0 || len(page) != PageSize || off < d.next {
		return fmt.Errorf("integrity: digest: a page of %d bytes at %#x after %#x", len(page), off, d.next)
	}
	d.add(off, page)
	return nil
}

func (d *PageDigest) add(off int64, page []byte) {
	if d.h != nil {
		binary.BigEndian.PutUint64(d.hdr[:], uint64(off))
		d.h.Write(d.hdr[:])
		d.h.Write(page)
	}
	if d.mac != nil {
		d.mac.Add(off, page)
	}
	d.next = off + PageSize
}

// Sum is the digest, in hex ("" for a check without it).
func (d *PageDigest) Sum() string {
	if d.h == nil {
		return ""
	}
	return hex.EncodeToString(d.h.Sum(nil))
}

// MAC is the keyed check, in hex ("" for a digest without it).
func (d *PageDigest) MAC() string {
	if d.mac == nil {
		return ""
	}
	return d.mac.Sum()
}
