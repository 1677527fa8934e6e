package receipt

import (
	"crypto/ed25519"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state", DefaultKeyFile)
	k, created, err := LoadOrCreateKey(path, true)
	if err != nil || !created {
		t.Fatalf("first start: created %v, %v", created, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi.Mode(), err)
	}
	pub, err := ReadPublicKey(PublicPath(path))
	if err != nil || !pub.Equal(k.Public()) {
		t.Fatalf("public half: %v", err)
	}
	if PublicPath(path) != filepath.Join(dir, "state", "receipt.pub") {
		t.Fatalf("public path %s", PublicPath(path))
	}
	k2, created, err := LoadOrCreateKey(path, true)
	if err != nil || created || !k2.Equal(k) {
		t.Fatalf("second start: created %v, %v", created, err)
	}
	// The public half is written again when missing.
	_ = os.Remove(PublicPath(path))
	if _, err := LoadKey(path); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPublicKey(PublicPath(path)); err != nil {
		t.Fatalf("public half not restored: %v", err)
	}
}

// TestLoadKeyRefuses: a key that is missing (after a first start), open
// to others, not a key, or not matching its public half stops the daemon
// with the reason; none is replaced by a new key.
func TestLoadKeyRefuses(t *testing.T) {
	fresh := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), DefaultKeyFile)
		if _, _, err := LoadOrCreateKey(p, true); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Run("missing after first start", func(t *testing.T) {
		p := fresh(t)
		_ = os.Remove(p)
		_, _, err := LoadOrCreateKey(p, true)
		if err == nil || !strings.Contains(err.Error(), "is missing, but its public half") {
			t.Fatalf("%v", err)
		}
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatal("a new key was made")
		}
	})
	t.Run("missing, not to be created", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "given.key")
		_, _, err := LoadOrCreateKey(p, false)
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "openssl genpkey") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("readable by others", func(t *testing.T) {
		p := fresh(t)
		_ = os.Chmod(p, 0o640)
		if _, _, err := LoadOrCreateKey(p, true); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("unreadable", func(t *testing.T) {
		if os.Geteuid() == 0 {
			t.Skip("root reads a 000 file")
		}
		p := fresh(t)
		_ = os.Chmod(p, 0o000)
		if _, _, err := LoadOrCreateKey(p, true); err == nil || !errors.Is(err, fs.ErrPermission) {
			t.Fatalf("%v", err)
		}
	})
	t.Run("not a key", func(t *testing.T) {
		p := fresh(t)
		_ = os.WriteFile(p, []byte("garbage"), 0o600)
		if _, _, err := LoadOrCreateKey(p, true); err == nil || !strings.Contains(err.Error(), "PRIVATE KEY") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		p := fresh(t)
		l := filepath.Join(filepath.Dir(p), "link.key")
		_ = os.Symlink(p, l)
		if _, _, err := LoadOrCreateKey(l, true); err == nil {
			t.Fatal("followed a symlink")
		}
	})
	t.Run("public half of another key", func(t *testing.T) {
		p := fresh(t)
		other := ed25519.NewKeyFromSeed(make([]byte, 32))
		_ = os.WriteFile(PublicPath(p), MarshalPublicKey(other.Public().(ed25519.PublicKey)), 0o644)
		if _, err := LoadKey(p); err == nil || !strings.Contains(err.Error(), "is not the public half") {
			t.Fatalf("%v", err)
		}
	})
	t.Run("private key given as public", func(t *testing.T) {
		p := fresh(t)
		if _, err := ReadPublicKey(p); err == nil || !strings.Contains(err.Error(), "give its public half") {
			t.Fatalf("%v", err)
		}
	})
}

// TestOpenSSLKeyFormat: a key made by openssl genpkey, as the error of a
// missing configured key suggests, loads.
func TestOpenSSLKeyFormat(t *testing.T) {
	const pemKey = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g\n-----END PRIVATE KEY-----\n"
	k, err := ParsePrivateKey([]byte(pemKey))
	if err != nil {
		t.Fatal(err)
	}
	if k.Seed()[0] != 1 || k.Seed()[31] != 32 {
		t.Fatalf("seed %x", k.Seed())
	}
}
