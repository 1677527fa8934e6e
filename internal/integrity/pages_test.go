package integrity

import (
	"bytes"
	"testing"
)

// image is a RAM image of 8 pages: data pages with a zero page written
// between them, and zero pages at the end.
func image() []byte {
	b := make([]byte, 8*PageSize)
	for _, p := range []int{0, 1, 3, 4, 5} {
		for i := range PageSize {
			b[p*PageSize+i] = byte(p*31 + i)
		}
	}
	return b
}

// TestPageDigest: the digest of an image, and its keyed check, do not
// depend on how it is added, nor on zero pages; they depend on where each
// page is, on its bytes, and the check on its key.
func TestPageDigest(t *testing.T) {
	image := image()
	key := bytes.Repeat([]byte{3}, KeySize)
	newDigest := func() *PageDigest {
		d, err := NewPageCheck(key, true)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	whole := newDigest()
	_ = whole.Add(0, image)
	parts := newDigest()
	for off := 0; off < len(image); off += 3 * PageSize {
		if err := parts.Add(int64(off), image[off:min(off+3*PageSize, len(image))]); err != nil {
			t.Fatal(err)
		}
	}
	sparse, pages := newDigest(), newDigest()
	for off := 0; off < len(image); off += PageSize {
		if p := image[off : off+PageSize]; !IsZeroPage(p) {
			_ = sparse.Add(int64(off), p)
			if err := pages.AddPage(int64(off), p); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, d := range map[string]*PageDigest{"in parts": parts, "its data pages": sparse, "page by page": pages} {
		if d.Sum() != whole.Sum() || d.MAC() != whole.MAC() {
			t.Errorf("%s: the digest or the check depends on how the image is read", name)
		}
	}
	alone := NewPageDigest()
	_ = alone.Add(0, image)
	checkOnly, _ := NewPageCheck(key, false)
	_ = checkOnly.Add(0, image)
	if alone.Sum() != whole.Sum() || alone.MAC() != "" || checkOnly.MAC() != whole.MAC() || checkOnly.Sum() != "" {
		t.Error("the digest or the check depends on the other being taken")
	}
	moved := newDigest()
	_ = moved.Add(PageSize, image[:len(image)-PageSize])
	changed := newDigest()
	b := bytes.Clone(image)
	b[5*PageSize-1] ^= 0x80
	_ = changed.Add(0, b)
	for name, d := range map[string]*PageDigest{"moved": moved, "changed": changed} {
		if d.Sum() == whole.Sum() || d.MAC() == whole.MAC() {
			t.Errorf("%s: the digest or the check did not change", name)
		}
	}
	other, _ := NewPageCheck(bytes.Repeat([]byte{4}, KeySize), false)
	_ = other.Add(0, image)
	if other.MAC() == whole.MAC() {
		t.Error("the check does not depend on its key")
	}
	if err := whole.Add(0, image[:PageSize]); err == nil {
		t.Error("pages added out of order")
	}
	if err := whole.AddPage(0, image[:PageSize]); err == nil {
		t.Error("a page added out of order")
	}
	if err := NewPageDigest().Add(1, image[:PageSize]); err == nil {
		t.Error("an unaligned page")
	}
	if err := NewPageDigest().AddPage(0, image[:PageSize-1]); err == nil {
		t.Error("a short page")
	}
	if _, err := NewPageCheck(key[1:], false); err == nil {
		t.Error("a key of 31 bytes")
	}
}
