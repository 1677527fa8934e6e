package sshkeys

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"
)

// dsaKey is an ssh-keygen -t dsa public key (generating DSA parameters in
// a test would take seconds).
const dsaKey = "ssh-dss AAAAB3NzaC1kc3MAAACBAKJsoSW+y0SM5X6FLhh56q8iZ7YXavkJS4X0jOWWMxon2SB4PehjEEmYnv/5ytKjbSDptM38QXtZrsoGdKwFPIE6/Yaaxt/av3o7elBMAbn/J7z57uP/kwLQMfMD/mFvZqxMrEOWAnKPhQJx5l6VAv7v8ISXuSua3GdxAz0rajbRAAAAFQCLAnq/Cumxu+tEtNrJnCWs5JWV2wAAAIAlw+/lx+X/yqOG0MmHNf5DX6PdX+B+yPnWz+GrxptL6jfI0/2Yap4tAxtP15sLjTQ47tLylouC6N2VvaOFvvc1kb1Li17qckVZfXi0Ebz4uD9lA07sJhgrSEj+nxLOCyVQekoPOb5YE172lqbd0p9Vwc2TMLfoDNNclWfoqYBRhgAAAIB45zuO+tHs7eWVF2eZ3u7X/+3Vq/70kpDy46XDA6P1UY9a7uyboKXd8GqK3doroG/JqV6PkR1vwwnT6QlF0MA4Wuq0kY8bCbjpgVQWs3HO9jzLPnPwGzJS/k4nQfI+qBMmx9EHhrZ+zsrmanNPSS8ldErHkQZF54w6RgEPszaLuQ=="

// testKeys are generated once per test binary.
var testKeys = sync.OnceValue(func() map[string]string {
	out := map[string]string{}
	add := func(name string, k any) {
		pub, err := ssh.NewPublicKey(k)
		if err != nil {
			panic(err)
		}
		out[name] = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pub)))
	}
	for _, name := range []string{"ed1", "ed2", "ed3"} {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		add(name, pub)
	}
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	add("ecdsa", &ec.PublicKey)
	r1, _ := rsa.GenerateKey(rand.Reader, 1024)
	add("rsa1024", &r1.PublicKey)
	r2, _ := rsa.GenerateKey(rand.Reader, 2048)
	add("rsa2048", &r2.PublicKey)

	// A certificate for ed1, signed by ed2's private key.
	_, caPriv, _ := ed25519.GenerateKey(rand.Reader)
	ca, _ := ssh.NewSignerFromKey(caPriv)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	spub, _ := ssh.NewPublicKey(pub)
	cert := &ssh.Certificate{Key: spub, CertType: ssh.UserCert, ValidPrincipals: []string{"agent"}, ValidBefore: ssh.CertTimeInfinity}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		panic(err)
	}
	out["cert"] = strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert)))
	out["dsa"] = dsaKey
	return out
})

func TestParse(t *testing.T) {
	k := testKeys()
	tests := []struct {
		name string
		src  string
		want []string // substrings of the error; nil: valid
	}{
		{"one key", `profile="sysadmin" ` + k["ed1"] + " alice@laptop\n", nil},
		{"unquoted profile", `profile=agent ` + k["ed1"], nil},
		{"comments and blank lines", "# keys\n\n   \n" + `profile="a" ` + k["ed1"] + "\r\n" + `profile="b",no-pty ` + k["ed2"] + " x\n", nil},
		{"every accepted type", `profile="a" ` + k["ed1"] + "\n" + `profile="a" ` + k["ecdsa"] + "\n" + `profile="a" ` + k["rsa2048"] + "\n", nil},
		{"options in any case", `Profile="a",NO-PTY ` + k["ed1"], nil},
		{"empty file", "", nil},

		{"no profile", k["ed1"] + " bob\n", []string{"x:1: key SHA256:", "has no profile=\"NAME\" option"}},
		{"no profile with other option", "no-pty " + k["ed1"], []string{"x:1:", "no profile="}},
		{"unknown option", `profile="a",command="/bin/true" ` + k["ed1"], []string{"x:1:", `unknown option "command"`}},
		{"from option", `from="10.0.0.0/8",profile="a" ` + k["ed1"], []string{`unknown option "from"`}},
		{"cert-authority", `cert-authority,profile="a" ` + k["ed1"], []string{`unknown option "cert-authority"`}},
		{"bad profile name", `profile="Sys_Admin" ` + k["ed1"], []string{"x:1:", `option "profile=\"Sys_Admin\""`, "want profile=\"NAME\""}},
		{"empty profile", `profile="" ` + k["ed1"], []string{"want profile=\"NAME\""}},
		{"profile without value", `profile ` + k["ed1"], []string{"want profile=\"NAME\""}},
		{"profile twice", `profile="a",profile="b" ` + k["ed1"], []string{`option "profile" given twice`}},
		{"no-pty with value", `profile="a",no-pty="x" ` + k["ed1"], []string{`option "no-pty" takes no value`}},
		{"garbage line", "profile=\"a\" hello world\n", []string{"x:1: not an authorized key"}},
		{"type mismatch", `profile="a" ssh-rsa ` + strings.Fields(k["ed1"])[1], []string{"x:1: not an authorized key"}},
		{"truncated base64", `profile="a" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI`, []string{"not an authorized key"}},
		{"unmatched quote", `profile="a ` + k["ed1"], []string{"not an authorized key"}},
		{"duplicate key", `profile="a" ` + k["ed1"] + "\n\n" + `profile="b" ` + k["ed1"] + " again\n", []string{"x:3: key SHA256:", "already listed on line 1"}},
		{"dsa", `profile="a" ` + k["dsa"], []string{`unknown key algorithm: "ssh-dss"`}},
		{"small rsa", `profile="a" ` + k["rsa1024"], []string{"RSA key of 1024 bits: at least 2048"}},
		{"certificate", `profile="a" ` + k["cert"], []string{"certificates are not accepted"}},
		{"control character in comment", `profile="a" ` + k["ed1"] + " bad\x1b[31mcomment", []string{"comment contains a control"}},
		{"zero-width in comment", `profile="a" ` + k["ed1"] + " a\u200bb", []string{"comment contains a control or an invisible"}},
		{"long comment", `profile="a" ` + k["ed1"] + " " + strings.Repeat("c", MaxComment+1), []string{"comment is 257 bytes"}},
		{"long line", `profile="a" ` + k["ed1"] + " " + strings.Repeat("c", MaxLineLength), []string{"x:1: line is"}},
		{"invalid utf-8", `profile="a" ` + k["ed1"] + " \xff", []string{"not valid UTF-8"}},
		{"every problem reported", "no-pty " + k["ed1"] + "\n" + `profile="a" ` + k["ed2"] + "\n" + `profile="a",x ` + k["ed3"] + "\n", []string{"x:1:", "x:3: unknown option \"x\""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("x", []byte(tt.src))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Parse: %v", err)
				}
				checkSet(t, s)
				return
			}
			if err == nil || s != nil {
				t.Fatalf("Parse accepted it (set %v, err %v)", s, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestParseEntries(t *testing.T) {
	k := testKeys()
	src := "# team\n" + `profile="sysadmin" ` + k["ed1"] + " alice@laptop\n" + `restrict,profile="agent" ` + k["ed2"] + "\n"
	s, err := Parse("keys", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 2 || s.Source() != "keys" {
		t.Fatalf("set %d keys from %q", s.Len(), s.Source())
	}
	pub1, _, _, _, _ := ssh.ParseAuthorizedKey([]byte(k["ed1"]))
	pub2, _, _, _, _ := ssh.ParseAuthorizedKey([]byte(k["ed2"]))
	pub3, _, _, _, _ := ssh.ParseAuthorizedKey([]byte(k["ed3"]))
	e := s.Lookup(pub1)
	if e == nil || e.Line != 2 || e.Profile != "sysadmin" || e.Comment != "alice@laptop" || e.NoPTY || e.Fingerprint != ssh.FingerprintSHA256(pub1) {
		t.Fatalf("entry 1: %+v", e)
	}
	e = s.Lookup(pub2)
	if e == nil || e.Line != 3 || e.Profile != "agent" || e.Comment != "" || !e.NoPTY {
		t.Fatalf("entry 2: %+v", e)
	}
	if s.Lookup(pub3) != nil || s.Lookup(nil) != nil || (*Set)(nil).Lookup(pub1) != nil {
		t.Fatal("lookup of an unlisted key found something")
	}
	// Lookup hands out copies.
	s.Lookup(pub1).Profile = "x"
	s.Entries()[0].Profile = "x"
	if s.Lookup(pub1).Profile != "sysadmin" {
		t.Fatal("set changed through a returned entry")
	}
}

// checkSet checks the invariants of every parsed set.
func checkSet(t testing.TB, s *Set) {
	t.Helper()
	seen := map[string]bool{}
	for _, e := range s.Entries() {
		if !profileRE.MatchString(e.Profile) || e.Line < 1 || e.Fingerprint != ssh.FingerprintSHA256(e.Key) {
			t.Fatalf("bad entry %+v", e)
		}
		if seen[e.Fingerprint] {
			t.Fatalf("key %s twice", e.Fingerprint)
		}
		seen[e.Fingerprint] = true
		if got := s.Lookup(e.Key); got == nil || got.Line != e.Line {
			t.Fatalf("lookup of line %d's key: %+v", e.Line, got)
		}
		if strings.ContainsFunc(e.Comment, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			t.Fatalf("comment with control characters: %q", e.Comment)
		}
	}
}

// render writes s back as an authorized-keys file.
func render(s *Set) []byte {
	var b bytes.Buffer
	for _, e := range s.Entries() {
		b.WriteString(`profile="` + e.Profile + `"`)
		if e.NoPTY {
			b.WriteString(",no-pty")
		}
		b.WriteString(" " + strings.TrimSpace(string(ssh.MarshalAuthorizedKey(e.Key))))
		if e.Comment != "" {
			b.WriteString(" " + e.Comment)
		}
		b.WriteString("\n")
	}
	return b.Bytes()
}

func FuzzParse(f *testing.F) {
	k := testKeys()
	for _, s := range []string{
		`profile="sysadmin" ` + k["ed1"] + " alice@laptop\n",
		"# c\n\n" + `profile=a,no-pty ` + k["ecdsa"] + "\r\n" + `restrict,profile="b" ` + k["ed2"],
		`profile="a",command="x,y" ` + k["ed1"],
		`profile="a ` + k["ed1"],
		`profile="a" ` + k["cert"],
		`profile="a" ` + k["dsa"],
		k["ed1"], "ssh-ed25519", "profile=\"a\" ssh-ed25519 AAAA\n", "\"\"\" ,,, \t",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz", data)
		if err != nil {
			if s != nil {
				t.Fatal("Parse returned a set and an error")
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "fuzz:") {
					t.Fatalf("error line does not name the file and line: %q", line)
				}
			}
			return
		}
		checkSet(t, s)
		// What was accepted renders to a file that parses to the same keys.
		s2, err := Parse("again", render(s))
		if err != nil {
			t.Fatalf("rendered set does not parse: %v\n%s", err, render(s))
		}
		a, b := s.Entries(), s2.Entries()
		if len(a) != len(b) {
			t.Fatalf("%d entries, %d after a round trip", len(a), len(b))
		}
		for i := range a {
			if a[i].Fingerprint != b[i].Fingerprint || a[i].Profile != b[i].Profile || a[i].NoPTY != b[i].NoPTY || a[i].Comment != b[i].Comment {
				t.Fatalf("entry %d changed in a round trip: %+v → %+v", i, a[i], b[i])
			}
		}
	})
}

func TestLoad(t *testing.T) {
	k := testKeys()
	dir := t.TempDir()
	p := filepath.Join(dir, "keys")
	if err := os.WriteFile(p, []byte(`profile="a" `+k["ed1"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Load(p)
	if err != nil || s.Len() != 1 || s.Source() != p {
		t.Fatalf("Load: %v", err)
	}
	if err := os.Chmod(p, 0o664); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "writable by group or others") {
		t.Fatalf("group-writable file: %v", err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("directory: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("bogus line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p+":1:") {
		t.Fatalf("bad file: %v", err)
	}
}

func TestHostKey(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "ssh_host_ed25519_key")
	s1, created, err := LoadOrCreateHostKey(p)
	if err != nil || !created || s1.PublicKey().Type() != ssh.KeyAlgoED25519 {
		t.Fatalf("create: %v (created %v)", err, created)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", st.Mode(), err)
	}
	pub, err := os.ReadFile(p + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	pk, comment, _, _, err := ssh.ParseAuthorizedKey(pub)
	if err != nil || !bytes.Equal(pk.Marshal(), s1.PublicKey().Marshal()) || comment != "vmgated host key" {
		t.Fatalf("public key file %q: %v", pub, err)
	}
	s2, created, err := LoadOrCreateHostKey(p)
	if err != nil || created || !bytes.Equal(s2.PublicKey().Marshal(), s1.PublicKey().Marshal()) {
		t.Fatalf("reload: %v (created %v)", err, created)
	}
	ents, _ := os.ReadDir(filepath.Dir(p))
	if len(ents) != 2 {
		t.Fatalf("files beside the key: %v", ents)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateHostKey(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable key: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateHostKey(bad); err == nil || !strings.Contains(err.Error(), "host key "+bad) {
		t.Fatalf("garbage key: %v", err)
	}
}
