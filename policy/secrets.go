package policy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/textproto"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"

	"github.com/vmgate/vmgate/policy/netrule"
)

// Secrets ([[secret]], profile.secrets): a value the guest never holds.
// A command that asks for a secret sees a placeholder in the variable of
// its name; the VM's network stack puts the value in, on the way out, in
// requests to the secret's hosts only, in the header fields it names (and
// the query when query = true). The policy declares them and reads their
// values (ReadSecrets, the daemon only); a decision grants the ones a
// request asks for and its session holds (Verdict.Secrets).

// MaxSecretBytes bounds a secret's value.
const MaxSecretBytes = 16 << 10

// RuleSecrets is the rule of a verdict that refused a secret the caller's
// profile does not list (profile.secrets).
const RuleSecrets = "secrets"

var credentialRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}$`)

// secretDoc is one [[secret]] as decoded.
type secretDoc struct {
	Name       *string   `toml:"name"`
	File       *string   `toml:"file"`
	Credential *string   `toml:"credential"`
	Hosts      *[]string `toml:"hosts"`
	Headers    *[]string `toml:"headers"`
	Query      *bool     `toml:"query"`
}

// secretDecl is a compiled [[secret]].
type secretDecl struct {
	name             string
	file, credential string // one of them
	hosts            netrule.Rules
	headers          []string // canonical header names
	query            bool
}

// SecretValue is a secret's value. It prints, logs and marshals as a
// mark, never as itself; Reveal is the one way to the value, for the
// network stack that puts it in.
type SecretValue struct{ v string }

// Reveal returns the value.
func (s SecretValue) Reveal() string { return s.v }

// IsZero reports whether there is no value.
func (s SecretValue) IsZero() bool { return s.v == "" }

func (SecretValue) String() string               { return "[secret]" }
func (SecretValue) GoString() string             { return "[secret]" }
func (SecretValue) LogValue() slog.Value         { return slog.StringValue("[secret]") }
func (SecretValue) MarshalText() ([]byte, error) { return []byte("[secret]"), nil }
func (s SecretValue) Format(f fmt.State, _ rune) { _, _ = io.WriteString(f, s.String()) }
func (SecretValue) MarshalJSON() ([]byte, error) { return []byte(`"[secret]"`), nil }
func (*SecretValue) UnmarshalJSON(_ []byte) error {
	return fmt.Errorf("a secret's value is never read from JSON")
}
func (*SecretValue) UnmarshalText(_ []byte) error {
	return fmt.Errorf("a secret's value is never read from text")
}
func (SecretValue) AppendText(b []byte) ([]byte, error) { return append(b, "[secret]"...), nil }

// Secret is a secret a verdict grants: where its value may go, and the
// value (read by ReadSecrets).
type Secret struct {
	Name    string
	Hosts   netrule.Rules
	Headers []string // header fields the placeholder may be replaced in
	Query   bool     // and the request target's query
	Value   SecretValue
}

// checkSecrets compiles the [[secret]] tables and checks each profile's
// secrets list against them and against its network.
func checkSecrets(c *compiler, d *document, p *Policy) {
	p.secrets = map[string]*secretDecl{}
	for i := range d.Secrets {
		if s := c.secret(i, &d.Secrets[i]); s != nil {
			if _, dup := p.secrets[s.name]; dup {
				c.errorf("secret[%d]: name %q: already declared", i, s.name)
				continue
			}
			p.secrets[s.name] = s
		}
	}
	for _, prof := range p.profiles {
		for _, name := range prof.secrets {
			s, ok := p.secrets[name]
			if !ok {
				c.errorf("%s: secrets: %q is not a declared [[secret]]", prof.label(), name)
				continue
			}
			if prof.net == nil {
				c.errorf("%s: secrets: %q needs network.mode = %q: a secret goes only to hosts the network allows", prof.label(), name, networkAllowlist)
				continue
			}
			for _, h := range s.hosts {
				if _, ok := prof.net.Rules.Covering(h); !ok {
					c.errorf("%s: secrets: %q is bound to %s, which the profile's network.allow does not allow", prof.label(), name, h.Text)
				}
			}
		}
	}
}

// secret validates one [[secret]].
func (c *compiler) secret(i int, d *secretDoc) *secretDecl {
	label := fmt.Sprintf("secret[%d]", i)
	s := &secretDecl{}
	switch {
	case d.Name == nil:
		c.errorf("%s: name: missing", label)
		return nil
	case !envNameRE.MatchString(*d.Name):
		c.errorf("%s: name %q: must be an environment variable's name, [A-Za-z_][A-Za-z0-9_]*", label, *d.Name)
		return nil
	}
	s.name = *d.Name
	label = fmt.Sprintf("secret %q", s.name)
	switch {
	case (d.File == nil) == (d.Credential == nil):
		c.errorf("%s: set one of file (a path only vmgated reads) and credential (a systemd credential's name)", label)
	case d.File != nil && !filepath.IsAbs(*d.File):
		c.errorf("%s: file %q: must be an absolute path", label, *d.File)
	case d.File != nil:
		s.file = filepath.Clean(*d.File)
	case !credentialRE.MatchString(*d.Credential):
		c.errorf("%s: credential %q: must be a systemd credential's name ([A-Za-z0-9_.-], no slash)", label, *d.Credential)
	default:
		s.credential = *d.Credential
	}
	if d.Hosts == nil || len(*d.Hosts) == 0 {
		c.errorf("%s: hosts: missing; name the hosts the value may go to, as network.allow does (\"api.github.com:443\")", label)
	} else if rs, err := netrule.ParseRules(*d.Hosts); err != nil {
		c.errorf("%s: hosts: %w", label, err)
	} else {
		s.hosts = rs
	}
	if d.Headers != nil {
		for _, h := range *d.Headers {
			if !validHeaderName(h) {
				c.errorf("%s: headers: %q is not a header field's name", label, h)
				continue
			}
			s.headers = append(s.headers, textproto.CanonicalMIMEHeaderKey(h))
		}
	}
	s.query = d.Query != nil && *d.Query
	if len(s.headers) == 0 && !s.query {
		c.errorf("%s: neither headers nor query = true: the placeholder could be replaced nowhere", label)
	}
	return s
}

// validHeaderName reports whether h is an HTTP field name (RFC 9110 token).
func validHeaderName(h string) bool {
	if h == "" || len(h) > 128 {
		return false
	}
	for _, r := range h {
		if r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

// ReadSecrets reads every declared secret's value: its file, or the
// systemd credential of its name in credDir ($CREDENTIALS_DIRECTORY). A
// file must be a regular file owned by this process's user, readable by
// no one else (mode 0600 or 0400); a credential, readable by no one but
// its owner (systemd makes it so). A value is the file's bytes without
// one trailing newline, 1 to MaxSecretBytes bytes, without CR, LF or
// NUL (it goes into a header field). Any failure names the secret and
// the file, never the value. The daemon calls it once, before it uses
// the policy; a policy whose values were not read grants no secret.
func (p *Policy) ReadSecrets(credDir string) error {
	if p == nil || len(p.secrets) == 0 {
		return nil
	}
	vals := make(map[string]SecretValue, len(p.secrets))
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(p.secrets)) {
		s := p.secrets[name]
		v, err := s.read(credDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: secret %q: %w", p.source, name, err))
			continue
		}
		vals[name] = v
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	p.values = vals
	return nil
}

func (s *secretDecl) read(credDir string) (SecretValue, error) {
	path := s.file
	if s.credential != "" {
		if credDir == "" {
			return SecretValue{}, fmt.Errorf("credential %q: no $CREDENTIALS_DIRECTORY (give vmgated.service LoadCredential=%s:PATH)", s.credential, s.credential)
		}
		path = filepath.Join(credDir, s.credential)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return SecretValue{}, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return SecretValue{}, fmt.Errorf("stat %s: %w", path, err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return SecretValue{}, fmt.Errorf("%s: not a regular file", path)
	case fi.Mode().Perm()&0o077 != 0:
		return SecretValue{}, fmt.Errorf("%s: mode %04o lets others read it: chmod 0600 (or 0400) it", path, fi.Mode().Perm())
	case s.file != "" && st != nil && int(st.Uid) != os.Geteuid():
		return SecretValue{}, fmt.Errorf("%s: owned by uid %d, not vmgated's (%d): chown it to vmgated's user", path, st.Uid, os.Geteuid())
	case fi.Size() > MaxSecretBytes+2:
		return SecretValue{}, fmt.Errorf("%s: %d bytes, above the %d a secret may hold", path, fi.Size(), MaxSecretBytes)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretBytes+3))
	if err != nil {
		return SecretValue{}, fmt.Errorf("read %s: %w", path, err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	switch {
	case len(b) == 0:
		return SecretValue{}, fmt.Errorf("%s: empty", path)
	case len(b) > MaxSecretBytes:
		return SecretValue{}, fmt.Errorf("%s: above the %d bytes a secret may hold", path, MaxSecretBytes)
	case bytes.ContainsAny(b, "\r\n\x00"):
		return SecretValue{}, fmt.Errorf("%s: holds a line break or a NUL byte inside (a value goes into a header field)", path)
	}
	return SecretValue{v: string(b)}, nil
}

// secretsOf grants prof's secrets asked (refused when one is not the
// profile's: rule and reason) and, silently, those of held (a session's,
// the daemon's word) the profile still lists.
func (p *Policy) secretsOf(prof *profile, asked, held []string) (grants []Secret, rule, reason string) {
	for _, n := range asked {
		if !slices.Contains(prof.secrets, n) {
			list := "none"
			if len(prof.secrets) > 0 {
				list = strings.Join(prof.secrets, ", ")
			}
			return nil, RuleSecrets, fmt.Sprintf("secret %s is not one of the profile's secrets (%s)", quote(n), list)
		}
		if _, ok := p.values[n]; !ok {
			return nil, RuleSecrets, fmt.Sprintf("secret %s: its value was not read (the daemon reads it at start and reload)", quote(n))
		}
	}
	seen := map[string]bool{}
	for _, n := range slices.Concat(held, asked) {
		if seen[n] || !slices.Contains(prof.secrets, n) {
			continue
		}
		seen[n] = true
		d, v := p.secrets[n], p.values[n]
		if d == nil || v.IsZero() {
			continue
		}
		grants = append(grants, Secret{Name: n, Hosts: d.hosts, Headers: d.headers, Query: d.query, Value: v})
	}
	slices.SortFunc(grants, func(a, b Secret) int { return strings.Compare(a.Name, b.Name) })
	return grants, "", ""
}

// SessionSecrets are the secrets of held (a session's) that id's profile
// still grants under p: a reload re-decides a running session's with it.
func (p *Policy) SessionSecrets(id Identity, held []string) []Secret {
	if p == nil || len(held) == 0 {
		return nil
	}
	prof, _ := p.profileFor(id)
	if prof == nil {
		return nil
	}
	g, _, _ := p.secretsOf(prof, nil, held)
	return g
}

// checkSecretNames checks the secret names of a request.
func checkSecretNames(req *Request) string {
	if len(req.Secrets) > MaxEnv {
		return fmt.Sprintf("%d secrets asked for; the limit is %d", len(req.Secrets), MaxEnv)
	}
	seen := map[string]bool{}
	for _, n := range req.Secrets {
		if !envNameRE.MatchString(n) {
			return fmt.Sprintf("secret name %s: must be an environment variable's name", quote(n))
		}
		if seen[n] {
			return fmt.Sprintf("secret %s asked for twice", quote(n))
		}
		seen[n] = true
	}
	for _, e := range req.Env {
		if name, _, _ := strings.Cut(e, "="); seen[name] {
			return fmt.Sprintf("environment variable %s is also a secret asked for: pass one or the other", quote(name))
		}
	}
	return ""
}
