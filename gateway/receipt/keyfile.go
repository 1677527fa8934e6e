package receipt

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vmgate/vmgate/internal/durable"
)

// The key files: the effects of this package, apart from the pure rest.

// DefaultKeyFile is the signing key's name in the daemon's state
// directory; its public half is PublicPath of it (receipt.pub).
const DefaultKeyFile = "receipt.key"

// maxKeyFile bounds a key file read.
const maxKeyFile = 64 << 10

// PublicPath is where the public half of the key at path is kept: path
// with .key replaced by .pub (or .pub appended).
func PublicPath(path string) string {
	if p, ok := strings.CutSuffix(path, ".key"); ok {
		return p + ".pub"
	}
	return path + ".pub"
}

// LoadKey reads the signing key at path. It must be a regular file owned
// by the calling user and readable by nobody else (mode 0600 or
// stricter); a public half beside it (PublicPath) must match it, and is
// written when missing.
func LoadKey(path string) (ed25519.PrivateKey, error) {
	data, err := readPrivate(path)
	if err != nil {
		return nil, err
	}
	key, err := ParsePrivateKey(data)
	if err != nil {
		return nil, fmt.Errorf("receipt signing key %s: %w", path, err)
	}
	pub := key.Public().(ed25519.PublicKey)
	pp := PublicPath(path)
	have, err := os.ReadFile(pp)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := durable.WriteFile(pp, MarshalPublicKey(pub), 0o644); err != nil {
			return nil, fmt.Errorf("receipt signing key: public half: %w", err)
		}
	case err != nil:
		return nil, fmt.Errorf("receipt signing key: public half: %w", err)
	default:
		p, perr := ParsePublicKey(have)
		if perr != nil || !p.Equal(pub) {
			return nil, fmt.Errorf("receipt signing key: %s is not the public half of %s: move it aside (it is written again from the key) or restore the matching key", pp, path)
		}
	}
	return key, nil
}

// LoadOrCreateKey is LoadKey, except that when create is set and neither
// the key nor its public half exists (the daemon's first start) it
// creates the key (mode 0600, directory 0750) and its public half (0644),
// and reports created. A missing key whose public half exists is an
// error, not a reason to make a new one: receipts already handed out
// name the old key, and a new key must be the operator's decision
// (docs/security.md, "Receipts").
func LoadOrCreateKey(path string, create bool) (key ed25519.PrivateKey, created bool, err error) {
	_, kerr := os.Lstat(path)
	if kerr == nil || !errors.Is(kerr, fs.ErrNotExist) {
		key, err := LoadKey(path)
		return key, false, err
	}
	pp := PublicPath(path)
	if _, perr := os.Lstat(pp); perr == nil {
		return nil, false, fmt.Errorf("receipt signing key %s is missing, but its public half %s exists: restore the key from its backup, "+
			"or, to sign with a new key from now on, move %s aside and start again (docs/security.md, \"Receipts\")", path, pp, pp)
	}
	if !create {
		return nil, false, fmt.Errorf("receipt signing key %s: %w (create one: openssl genpkey -algorithm ed25519 -out %s && chmod 600 %s)", path, fs.ErrNotExist, path, path)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, false, fmt.Errorf("receipt signing key: generate: %w", err)
	}
	data, err := MarshalPrivateKey(priv)
	if err != nil {
		return nil, false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, false, fmt.Errorf("receipt signing key: %w", err)
	}
	if err := durable.WriteFile(path, data, 0o600); err != nil {
		return nil, false, fmt.Errorf("receipt signing key: %w", err)
	}
	if err := durable.WriteFile(pp, MarshalPublicKey(priv.Public().(ed25519.PublicKey)), 0o644); err != nil {
		return nil, false, fmt.Errorf("receipt signing key: public half: %w", err)
	}
	return priv, true, nil
}

// ReadPublicKey reads a public key file (PKIX PEM). Given a private key
// file it says to use the public half instead.
func ReadPublicKey(path string) (ed25519.PublicKey, error) {
	data, err := readBounded(path)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	if bytes.Contains(data, []byte("PRIVATE KEY")) {
		return nil, fmt.Errorf("public key %s: a private key; give its public half (%s, or vmgated receipt key)", path, PublicPath(path))
	}
	k, err := ParsePublicKey(data)
	if err != nil {
		return nil, fmt.Errorf("public key %s: %w", path, err)
	}
	return k, nil
}

// readPrivate reads a private key file after checking that only its
// owner, the calling user, can read it.
func readPrivate(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("receipt signing key: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("receipt signing key: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("receipt signing key: %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("receipt signing key: %s is accessible by group or others (mode %04o): chmod 600 %s", path, perm, path)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("receipt signing key: %s belongs to uid %d, not to the daemon's uid %d: chown it to the daemon's user", path, sys.Uid, os.Geteuid())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, fmt.Errorf("receipt signing key: %w", err)
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("receipt signing key: %s is over %d bytes", path, maxKeyFile)
	}
	return data, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxKeyFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxKeyFile {
		return nil, fmt.Errorf("%s is over %d bytes", path, maxKeyFile)
	}
	return data, nil
}
