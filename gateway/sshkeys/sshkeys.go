// Package sshkeys reads the two files of vmgated's SSH front door: the
// authorized-keys file, which lists the public keys that may connect and
// the policy profile each one gets, and the daemon's host key, which it
// creates on first start.
//
// # Authorized keys
//
// The file has OpenSSH's authorized_keys syntax, one key per line, blank
// lines and lines starting with '#' ignored:
//
//	profile="sysadmin" ssh-ed25519 AAAAC3Nza… alice@laptop
//	profile="agent",no-pty ssh-ed25519 AAAAC3Nza… llama-server on build-1
//
// Options (comma-separated, before the key type):
//
//	profile="NAME"  required: the policy profile the key gets (a profile
//	                name: 1 to 64 of [a-z0-9-]); the profile must accept
//	                SSH keys (match.ssh = true or match.any = true)
//	no-pty          refuse terminals (pty-req), as OpenSSH's option does
//	restrict        the same as no-pty here (the front door never
//	                forwards ports, agents or X11)
//
// Every other option (command=, from=, cert-authority, …) is an error, as
// are a key without profile=, a key listed twice, certificates, DSA keys,
// RSA keys under 2048 bits and comments with control characters. Errors
// name the file and line, and all of them are reported at once; a file with
// any error is refused as a whole (the daemon does not start, or keeps the
// previous file on reload), so a typo never silently drops or widens a key.
//
// # Threat model
//
// The file and the host key are the operator's and trusted; the file must
// not be writable by group or others ([Load] refuses it), and the host key
// must be readable by its owner only ([LoadOrCreateHostKey] refuses it
// otherwise, and creates it with mode 0600). A key in the file is the whole
// identity of an SSH caller: whoever holds the private key gets its
// profile, from wherever the front door can be reached. Revoking a key is
// removing its line and sending vmgated SIGHUP. Clients pin the host key
// (the .pub file written beside it) in their known_hosts; a client that
// accepts any host key can be sent to another server that records its
// commands.
package sshkeys

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/internal/durable"
)

// Limits on the authorized-keys file. A 16384-bit RSA key in base64 is
// about 2.8 KB; the limits only stop a wrong file from being read whole.
const (
	MaxFileSize   = 4 << 20
	MaxLineLength = 16 << 10
	MaxComment    = 256
	MinRSABits    = 2048
)

// Entry is one key of an authorized-keys file.
type Entry struct {
	// Line is the entry's line number in the file (from 1).
	Line int
	Key  ssh.PublicKey
	// Fingerprint is the key's SHA-256 fingerprint ("SHA256:…"), as
	// ssh-keygen -l prints it.
	Fingerprint string
	Comment     string
	// Profile is the policy profile the key gets.
	Profile string
	// NoPTY refuses terminals (no-pty or restrict).
	NoPTY bool
}

// Set is a parsed authorized-keys file. It is immutable.
type Set struct {
	source  string
	entries []*Entry
	byKey   map[string]*Entry // by the key's wire encoding
}

// Source is the name the set was parsed under (its file name).
func (s *Set) Source() string { return s.source }

// Len is the number of keys.
func (s *Set) Len() int { return len(s.entries) }

// Entries returns copies of the entries in file order.
func (s *Set) Entries() []Entry {
	out := make([]Entry, len(s.entries))
	for i, e := range s.entries {
		out[i] = *e
	}
	return out
}

// Lookup returns the entry of key k, or nil if k is not in the set. Keys
// are compared by their whole wire encoding.
func (s *Set) Lookup(k ssh.PublicKey) *Entry {
	if s == nil || k == nil {
		return nil
	}
	e := s.byKey[string(k.Marshal())]
	if e == nil {
		return nil
	}
	c := *e
	return &c
}

var profileRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,63}$`)

// Parse parses an authorized-keys file. name (usually the file name)
// prefixes every error; every problem is reported (errors.Join), each as
// "name:LINE: …".
func Parse(name string, data []byte) (*Set, error) {
	s := &Set{source: name, byKey: map[string]*Entry{}}
	var errs []error
	lines := strings.Split(string(data), "\n")
	for i, line := range lines {
		n := i + 1
		line = strings.TrimSpace(strings.TrimSuffix(line, "\r"))
		if line == "" || line[0] == '#' {
			continue
		}
		e, err := parseLine(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: %w", name, n, err))
			continue
		}
		e.Line = n
		wireKey := string(e.Key.Marshal())
		if prev := s.byKey[wireKey]; prev != nil {
			errs = append(errs, fmt.Errorf("%s:%d: key %s is already listed on line %d", name, n, e.Fingerprint, prev.Line))
			continue
		}
		s.byKey[wireKey] = e
		s.entries = append(s.entries, e)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// parseLine parses one non-empty, non-comment line.
func parseLine(line string) (*Entry, error) {
	if len(line) > MaxLineLength {
		return nil, fmt.Errorf("line is %d bytes; the limit is %d", len(line), MaxLineLength)
	}
	if !utf8.ValidString(line) {
		return nil, errors.New("not valid UTF-8")
	}
	key, comment, options, rest, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return nil, fmt.Errorf("not an authorized key (OPTIONS KEYTYPE BASE64 COMMENT): %w", err)
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("trailing data after the key") // cannot happen for one line
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	e := &Entry{Key: key, Fingerprint: ssh.FingerprintSHA256(key), Comment: comment}
	if len(comment) > MaxComment {
		return nil, fmt.Errorf("comment is %d bytes; the limit is %d", len(comment), MaxComment)
	}
	if strings.ContainsFunc(comment, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }) {
		return nil, errors.New("comment contains a control or an invisible character")
	}
	seen := map[string]bool{}
	for _, opt := range options {
		name, value, hasValue := strings.Cut(opt, "=")
		lname := strings.ToLower(name) // OpenSSH compares option names without case
		if seen[lname] {
			return nil, fmt.Errorf("option %s given twice", quoteOpt(name))
		}
		seen[lname] = true
		switch lname {
		case "profile":
			p := value
			if len(p) >= 2 && p[0] == '"' && p[len(p)-1] == '"' {
				p = p[1 : len(p)-1]
			}
			if !hasValue || !profileRE.MatchString(p) {
				return nil, fmt.Errorf("option %s: want profile=\"NAME\", NAME a policy profile name (1 to 64 of [a-z0-9-])", quoteOpt(opt))
			}
			e.Profile = p
		case "no-pty", "restrict":
			if hasValue {
				return nil, fmt.Errorf("option %s takes no value", quoteOpt(name))
			}
			e.NoPTY = true
		default:
			return nil, fmt.Errorf("unknown option %s (known: profile=\"NAME\", no-pty, restrict)", quoteOpt(name))
		}
	}
	if e.Profile == "" {
		return nil, fmt.Errorf("key %s has no profile=\"NAME\" option: every key must name the policy profile it gets", e.Fingerprint)
	}
	return e, nil
}

// quoteOpt quotes an option (or its name) for an error, cut short.
func quoteOpt(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return fmt.Sprintf("%q", s)
}

// checkKey refuses keys the front door does not accept.
func checkKey(k ssh.PublicKey) error {
	// DSA keys do not get here: package ssh no longer parses them.
	switch k.Type() {
	case ssh.KeyAlgoRSA:
		ck, ok := k.(ssh.CryptoPublicKey)
		if !ok {
			return errors.New("unreadable RSA key")
		}
		rk, ok := ck.CryptoPublicKey().(*rsa.PublicKey)
		if !ok || rk.N.BitLen() < MinRSABits {
			bits := 0
			if ok {
				bits = rk.N.BitLen()
			}
			return fmt.Errorf("RSA key of %d bits: at least %d are required", bits, MinRSABits)
		}
	}
	if _, ok := k.(*ssh.Certificate); ok {
		return errors.New("certificates are not accepted: list the plain public key")
	}
	return nil
}

// Load reads and parses the authorized-keys file at path. It refuses a
// file that group or others may write, or that is not a regular file.
func Load(path string) (*Set, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("authorized keys: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("authorized keys: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("authorized keys: %s is not a regular file", path)
	}
	if st.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("authorized keys: %s is writable by group or others (mode %04o): chmod go-w %s", path, st.Mode().Perm(), path)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("authorized keys: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("authorized keys: %s is larger than %d bytes", path, MaxFileSize)
	}
	return Parse(path, data)
}

// LoadOrCreateHostKey reads the host key at path, or, if there is no file
// there, creates an ed25519 key (mode 0600, OpenSSH format) and writes its
// public half to path.pub for clients to pin. created reports which. An
// existing key that group or others may read is refused.
func LoadOrCreateHostKey(path string) (signer ssh.Signer, created bool, err error) {
	data, err := readPrivate(path)
	if errors.Is(err, fs.ErrNotExist) {
		if err := createHostKey(path); err != nil {
			return nil, false, err
		}
		created = true
		data, err = readPrivate(path)
	}
	if err != nil {
		return nil, false, err
	}
	signer, err = ssh.ParsePrivateKey(data)
	if err != nil {
		return nil, false, fmt.Errorf("host key %s: %w", path, err)
	}
	if created {
		pub := append(bytes.TrimSpace(ssh.MarshalAuthorizedKey(signer.PublicKey())), []byte(" vmgated host key\n")...)
		if err := durable.WriteFile(path+".pub", pub, 0o644); err != nil {
			return nil, false, err
		}
	}
	return signer, created, nil
}

func readPrivate(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("host key: %s is not a regular file", path)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("host key: %s is accessible by group or others (mode %04o): chmod 600 %s", path, st.Mode().Perm(), path)
	}
	data, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("host key: %w", err)
	}
	return data, nil
}

func createHostKey(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return fmt.Errorf("host key: generate: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "vmgated host key")
	if err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("host key: %w", err)
	}
	return durable.WriteFile(path, pem.EncodeToMemory(block), 0o600)
}
