package integrity

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDomains: the kinds of file under one key have domains of their own.
func TestDomains(t *testing.T) {
	seen := map[Domain]bool{}
	for _, d := range []Domain{DomainRAM, DomainOverlay, DomainState} {
		if seen[d] || d == 0 {
			t.Errorf("domain %d is shared or zero", d)
		}
		seen[d] = true
	}
}

// TestFileSums: a file's digest and keyed check, read beside each other,
// are those read apart; a missing file is an error.
func TestFileSums(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state")
	data := []byte(strings.Repeat("device state ", 20000))
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	key := bytes.Repeat([]byte{5}, KeySize)
	sum, mac, err := FileSums(path, key, DomainState)
	wantSum, _ := ReaderSHA256(bytes.NewReader(data))
	wantMAC, _ := ReaderMAC(bytes.NewReader(data), key, DomainState)
	if err != nil || sum != wantSum || mac != wantMAC {
		t.Errorf("FileSums: %s %s %v, want %s %s", sum, mac, err, wantSum, wantMAC)
	}
	if got, err := FileSHA256(path); err != nil || got != wantSum {
		t.Errorf("FileSHA256: %s %v", got, err)
	}
	if _, _, err := FileSums(path+".missing", key, DomainState); err == nil {
		t.Error("the sums of a missing file")
	}
	if _, _, err := FileSums(path, key[:3], DomainState); err == nil {
		t.Error("the sums under a key of 3 bytes")
	}
}

// TestExtentSHA256: the digest of a sparse file covers its extents'
// places and bytes; an error finding them is the digest's.
func TestExtentSHA256(t *testing.T) {
	data := bytes.Repeat([]byte("abcdefgh"), 4096)
	extents := func(ext ...[2]int64) func(func(off, n int64) error) error {
		return func(fn func(off, n int64) error) error {
			for _, e := range ext {
				if err := fn(e[0], e[1]); err != nil {
					return err
				}
			}
			return nil
		}
	}
	a, err := ExtentSHA256(bytes.NewReader(data), extents([2]int64{0, 4096}, [2]int64{8192, 4096}))
	if err != nil {
		t.Fatal(err)
	}
	for name, ext := range map[string][][2]int64{
		"one extent less":  {{0, 4096}},
		"an extent moved":  {{0, 4096}, {12288, 4096}},
		"an extent longer": {{0, 4096}, {8192, 8192}},
	} {
		if b, err := ExtentSHA256(bytes.NewReader(data), extents(ext...)); err != nil || b == a {
			t.Errorf("%s: %s %v, the same digest", name, b, err)
		}
	}
	errRead := errors.New("extents failed")
	if _, err := ExtentSHA256(bytes.NewReader(data), func(func(off, n int64) error) error { return errRead }); !errors.Is(err, errRead) {
		t.Errorf("extents that fail: %v", err)
	}
}
