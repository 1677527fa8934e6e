// Package integrity holds the sums that name and check vmgate's saved
// files (templates, save points): their SHA-256 digests, which name what
// ran (the audit log, template.json), and their keyed checks (MAC), under
// a key drawn for each save point, which a restore checks because they
// cost a quarter of a digest. A RAM image is summed by its pages that are
// not all zeros (PageDigest), so that its sums name its content whatever
// the layout of the file holding it; other files whole (FileMAC,
// ReaderSHA256).
//
// Every kind of file a keyed check covers has its own domain (Domain):
// the checks of a save point's files share one key, and the domain keeps
// their nonces apart. All domains are declared here, so that no two kinds
// can share one.
//
// It is a leaf: it imports no package of the module.
package integrity

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
)

// PageSize is the page of a RAM image (x86's target page), the unit in
// which its sums take it.
const PageSize = 4096

var zeroPage [PageSize]byte

// IsZeroPage tells whether page p holds only zeros.
func IsZeroPage(p []byte) bool { return bytes.Equal(p, zeroPage[:]) }

// A Domain is the kind of file a keyed check covers: its nonces start
// with the domain, so that the checks of two kinds of file under one key
// never share one.
type Domain uint32

// The domains of a save point's files.
const (
	DomainRAM     Domain = 1 // the RAM image (NewPageCheck)
	DomainOverlay Domain = 2 // the disk's overlay (FileMAC)
	DomainState   Domain = 3 // the device state (FileMAC)
)

// ReaderSHA256 is the hex SHA-256 of what r yields.
func ReaderSHA256(r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.CopyBuffer(h, r, make([]byte, 1<<20)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// FileSHA256 is the hex SHA-256 of the file at path.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return ReaderSHA256(f)
}

// FileSums is the hex SHA-256 of the file at path and its keyed check
// (FileMAC) under key in domain d, each read by a goroutine of its own:
// the caller waits for the longer, SHA-256.
func FileSums(path string, key []byte, d Domain) (sum, mac string, err error) {
	check := make(chan error, 1)
	go func() {
		f, err := os.Open(path)
		if err != nil {
			check <- err
			return
		}
		defer f.Close()
		mac, err = ReaderMAC(f, key, d)
		check <- err
	}()
	sum, err = FileSHA256(path)
	if err = cmp.Or(err, <-check); err != nil {
		return "", "", err
	}
	return sum, mac, nil
}

// ExtentSHA256 digests a sparse file by its data extents, which extents
// gives in order (offset, length; as SEEK_DATA and SEEK_HOLE find them):
// for each, its offset, its length and its bytes, read from r. Holes are
// not read, so a RAM file's digest costs what its data does. It is the
// RAM's digest of the first save point format, read to check those.
func ExtentSHA256(r io.ReaderAt, extents func(fn func(off, n int64) error) error) (string, error) {
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var hdr [16]byte
	err := extents(func(off, n int64) error {
		binary.BigEndian.PutUint64(hdr[:8], uint64(off))
		binary.BigEndian.PutUint64(hdr[8:], uint64(n))
		h.Write(hdr[:])
		_, err := io.CopyBuffer(h, io.NewSectionReader(r, off, n), buf)
		return err
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
