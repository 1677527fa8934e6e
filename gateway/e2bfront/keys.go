package e2bfront

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"syscall"
	"unicode"
	"unicode/utf8"
)

// Limits on the keys file: they only stop a wrong file from being read
// whole.
const (
	MaxKeysFileSize = 1 << 20
	MaxKeyLine      = 4096
	MaxKeyComment   = 256
)

// KeyPrefix starts every key `vmgated e2b key add` makes: the SDKs check
// that a key is KeyPrefix and hex before they send it.
const KeyPrefix = "e2b_"

// keyRE is what a key in the file may be: an SDK's key is "e2b_" and hex,
// but any token of these characters is accepted (the SDK's check is then
// off: E2B_VALIDATE_API_KEY=false).
var keyRE = regexp.MustCompile(`^[A-Za-z0-9_.~-]{32,256}$`)

var profileRE = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// Key is one entry of the keys file.
type Key struct {
	Line    int
	Profile string
	// Fingerprint names the key in logs and the audit log ("SHA256:…",
	// of the key's bytes); the key itself is never logged.
	Fingerprint string
	Comment     string
	hash        [sha256.Size]byte
}

// Keys is a parsed keys file.
type Keys struct {
	source string
	keys   []Key
}

// Source is the file the keys were read from.
func (k *Keys) Source() string { return k.source }

// Len is the number of keys.
func (k *Keys) Len() int { return len(k.keys) }

// All returns the keys in file order.
func (k *Keys) All() []Key { return append([]Key(nil), k.keys...) }

// Lookup returns the entry of the presented API key, or nil. Every entry
// is compared, in constant time each, so the time taken does not tell
// which entry (or how much of one) matched.
func (k *Keys) Lookup(presented string) *Key {
	if k == nil {
		return nil
	}
	h := sha256.Sum256([]byte(presented))
	var found *Key
	for i := range k.keys {
		if subtle.ConstantTimeCompare(h[:], k.keys[i].hash[:]) == 1 {
			found = &k.keys[i]
		}
	}
	return found
}

// Fingerprint is the fingerprint of an API key: "SHA256:" and the
// unpadded base64 of its SHA-256, as ssh-keygen names a public key.
func Fingerprint(key string) string {
	h := sha256.Sum256([]byte(key))
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(h[:])
}

// NewKey returns a new random API key: KeyPrefix and 256 bits in hex.
func NewKey() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return KeyPrefix + hex.EncodeToString(b[:])
}

// FormatLine is the keys file's line for key.
func FormatLine(profile, key, comment string) string {
	line := fmt.Sprintf("profile=%q %s", profile, key)
	if comment != "" {
		line += " " + comment
	}
	return line + "\n"
}

// ParseKeys parses a keys file (name is for messages). Every error is
// reported, with its line; a file with any is refused whole, so a typo
// never drops or widens a key.
func ParseKeys(name string, data []byte) (*Keys, error) {
	ks := &Keys{source: name}
	var errs []error
	seen := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 4096), MaxKeyLine)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := parseKeyLine(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", name, n, err))
			continue
		}
		k.Line = n
		if prev, dup := seen[k.hash]; dup {
			errs = append(errs, fmt.Errorf("%s:%d: the key of line %d again", name, n, prev))
			continue
		}
		seen[k.hash] = n
		ks.keys = append(ks.keys, *k)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s:%d: %w (lines are at most %d bytes)", name, n+1, err, MaxKeyLine))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ks, nil
}

// parseKeyLine parses `profile="NAME" KEY [COMMENT]`. Messages never
// quote the key.
func parseKeyLine(line string) (*Key, error) {
	opt, rest, _ := strings.Cut(line, " ")
	name, ok := strings.CutPrefix(opt, `profile="`)
	if !ok || !strings.HasSuffix(name, `"`) {
		return nil, errors.New(`want profile="NAME" KEY [COMMENT]`)
	}
	name = strings.TrimSuffix(name, `"`)
	if !profileRE.MatchString(name) {
		return nil, fmt.Errorf("profile %q: a profile name is 1 to 64 of [a-z0-9-]", name)
	}
	key, comment, _ := strings.Cut(strings.TrimLeft(rest, " \t"), " ")
	if !keyRE.MatchString(key) {
		return nil, errors.New("the key must be 32 to 256 of [A-Za-z0-9_.~-] (vmgated e2b key add makes one)")
	}
	comment = strings.TrimSpace(comment)
	if len(comment) > MaxKeyComment || !utf8.ValidString(comment) || strings.IndexFunc(comment, unicode.IsControl) >= 0 {
		return nil, fmt.Errorf("comment: at most %d bytes of UTF-8 without control characters", MaxKeyComment)
	}
	return &Key{Profile: name, Fingerprint: Fingerprint(key), Comment: comment, hash: sha256.Sum256([]byte(key))}, nil
}

// LoadKeys reads the keys file at path. It holds bearer secrets, so it
// must be a regular file that neither group nor others may read or
// write, owned by the daemon's user or root.
func LoadKeys(path string) (*Keys, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("e2b keys: %w", err)
	}
	defer f.Close()
	if err := checkKeysFile(f, path); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxKeysFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("e2b keys: %w", err)
	}
	if len(data) > MaxKeysFileSize {
		return nil, fmt.Errorf("e2b keys: %s is larger than %d bytes", path, MaxKeysFileSize)
	}
	return ParseKeys(path, data)
}

// checkKeysFile refuses a keys file that others could read or change.
func checkKeysFile(f *os.File, path string) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("e2b keys: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("e2b keys: %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return fmt.Errorf("e2b keys: %s holds secrets but group or others may use it (mode %04o): chmod 600 %s", path, perm, path)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid != 0 && int(sys.Uid) != os.Geteuid() {
		return fmt.Errorf("e2b keys: %s is owned by uid %d, neither root nor vmgated's user (uid %d)", path, sys.Uid, os.Geteuid())
	}
	return nil
}

// byFingerprint returns the entry whose key has the fingerprint, or nil.
func (k *Keys) byFingerprint(fp string) *Key {
	if k == nil {
		return nil
	}
	for i := range k.keys {
		if k.keys[i].Fingerprint == fp {
			return &k.keys[i]
		}
	}
	return nil
}
