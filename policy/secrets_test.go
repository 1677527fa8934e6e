package policy

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// secretPolicy declares GH_TOKEN bound to api.github.com:443 (file
// path %s), listed by profile "p" whose network allows it.
const secretPolicy = `version = 1
[[secret]]
name = "GH_TOKEN"
file = %q
hosts = ["api.github.com:443"]
headers = ["authorization"]
[[secret]]
name = "Q_KEY"
credential = "qkey"
hosts = ["api.example.com:443"]
query = true
[[profile]]
name = "p"
match = { any = true }
secrets = ["GH_TOKEN"]
network = { mode = "allowlist", allow = ["*.github.com:443", "api.example.com:443"] }
`

func TestSecretErrors(t *testing.T) {
	head := "version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = true }\nnetwork = { mode = \"allowlist\", allow = [\"a.example:443\"] }\n"
	tests := []struct {
		name, src, want string
	}{
		{"bad name", "[[secret]]\nname = \"1X\"\nfile = \"/s\"\nhosts = [\"a.example:443\"]\nheaders = [\"X\"]\n", `name "1X": must be an environment variable's name`},
		{"no name", "[[secret]]\nfile = \"/s\"\n", "secret[0]: name: missing"},
		{"neither file nor credential", "[[secret]]\nname = \"A\"\nhosts = [\"a.example:443\"]\nheaders = [\"X\"]\n", `secret "A": set one of file`},
		{"both", "[[secret]]\nname = \"A\"\nfile = \"/s\"\ncredential = \"c\"\nhosts = [\"a.example:443\"]\nheaders = [\"X\"]\n", `secret "A": set one of file`},
		{"relative file", "[[secret]]\nname = \"A\"\nfile = \"s\"\nhosts = [\"a.example:443\"]\nheaders = [\"X\"]\n", `file "s": must be an absolute path`},
		{"credential with slash", "[[secret]]\nname = \"A\"\ncredential = \"../c\"\nhosts = [\"a.example:443\"]\nheaders = [\"X\"]\n", `credential "../c": must be`},
		{"no hosts", "[[secret]]\nname = \"A\"\nfile = \"/s\"\nheaders = [\"X\"]\n", `secret "A": hosts: missing`},
		{"bad host", "[[secret]]\nname = \"A\"\nfile = \"/s\"\nhosts = [\"a b\"]\nheaders = [\"X\"]\n", `secret "A": hosts:`},
		{"bad header", "[[secret]]\nname = \"A\"\nfile = \"/s\"\nhosts = [\"a.example:443\"]\nheaders = [\"X Y\"]\n", `headers: "X Y" is not a header field's name`},
		{"nowhere", "[[secret]]\nname = \"A\"\nfile = \"/s\"\nhosts = [\"a.example:443\"]\n", `neither headers nor query = true`},
		{"twice", "[[secret]]\nname = \"A\"\nfile = \"/s\"\nhosts = [\"a.example:443\"]\nquery = true\n[[secret]]\nname = \"A\"\nfile = \"/t\"\nhosts = [\"a.example:443\"]\nquery = true\n", `secret[1]: name "A": already declared`},
		{"undeclared in profile", "secrets = [\"NOPE\"]\n", `profile "p": secrets: "NOPE" is not a declared [[secret]]`},
		{"listed twice", "secrets = [\"A\", \"A\"]\n[[secret]]\nname = \"A\"\nfile = \"/s\"\nhosts = [\"a.example:443\"]\nquery = true\n", `secrets: "A" is listed twice`},
		{"host the network does not allow", "secrets = [\"A\"]\n[[secret]]\nname = \"A\"\nfile = \"/s\"\nhosts = [\"b.example:443\"]\nquery = true\n", `secrets: "A" is bound to b.example:443, which the profile's network.allow does not allow`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("x.toml", []byte(head+tt.src))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want it to hold %q", err, tt.want)
			}
		})
	}
	_, err := Parse("x.toml", []byte("version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = true }\nsecrets = [\"A\"]\n[[secret]]\nname = \"A\"\nfile = \"/s\"\nhosts = [\"a.example:443\"]\nquery = true\n"))
	if err == nil || !strings.Contains(err.Error(), `secrets: "A" needs network.mode = "allowlist"`) {
		t.Fatalf("a profile without a network: err = %v", err)
	}
}

// writeSecret writes value to a file in dir with mode and returns its path.
func writeSecret(t *testing.T, dir, name, value string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(value), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadSecrets(t *testing.T) {
	dir := t.TempDir()
	cred := t.TempDir()
	writeSecret(t, cred, "qkey", "q-value", 0o400)
	good := writeSecret(t, dir, "gh", "ghp_value\n", 0o600)
	p := mustParse(t, "x.toml", fmt.Sprintf(secretPolicy, good))
	if err := p.ReadSecrets(cred); err != nil {
		t.Fatal(err)
	}
	if got := p.values["GH_TOKEN"].Reveal(); got != "ghp_value" {
		t.Errorf("value = %q; want the file without its newline", got)
	}

	for _, tt := range []struct {
		name, value string
		mode        os.FileMode
		credDir     string
		want        string
	}{
		{"world-readable", "v", 0o644, cred, "mode 0644 lets others read it"},
		{"group-readable", "v", 0o640, cred, "mode 0640"},
		{"empty", "\n", 0o600, cred, "empty"},
		{"line break inside", "a\nb", 0o600, cred, "line break"},
		{"too long", strings.Repeat("x", MaxSecretBytes+1), 0o600, cred, "above the"},
		{"no credentials directory", "v", 0o600, "", "no $CREDENTIALS_DIRECTORY"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := writeSecret(t, t.TempDir(), "s", tt.value, tt.mode)
			p := mustParse(t, "x.toml", fmt.Sprintf(secretPolicy, f))
			err := p.ReadSecrets(tt.credDir)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v; want %q", err, tt.want)
			}
			if strings.Contains(err.Error(), tt.value) && len(tt.value) > 2 {
				t.Errorf("the error names the value: %v", err)
			}
			if len(p.values) != 0 {
				t.Errorf("a failed read kept values")
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		p := mustParse(t, "x.toml", fmt.Sprintf(secretPolicy, filepath.Join(dir, "none")))
		if err := p.ReadSecrets(cred); err == nil || !strings.Contains(err.Error(), `secret "GH_TOKEN": read `) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		l := filepath.Join(t.TempDir(), "link")
		if err := os.Symlink(good, l); err != nil {
			t.Fatal(err)
		}
		p := mustParse(t, "x.toml", fmt.Sprintf(secretPolicy, l))
		if err := p.ReadSecrets(cred); err == nil {
			t.Fatal("a symlink was followed")
		}
	})
}

func TestDecideSecrets(t *testing.T) {
	cred := t.TempDir()
	writeSecret(t, cred, "qkey", "q-value", 0o400)
	p := mustParse(t, "x.toml", fmt.Sprintf(secretPolicy, writeSecret(t, t.TempDir(), "gh", "ghp_value", 0o600)))
	if err := p.ReadSecrets(cred); err != nil {
		t.Fatal(err)
	}
	id := idUID
	v := p.Decide(id, Request{Argv: []string{"true"}, Secrets: []string{"GH_TOKEN"}})
	if !v.Allowed || len(v.Secrets) != 1 || v.Secrets[0].Value.Reveal() != "ghp_value" || v.Secrets[0].Headers[0] != "Authorization" {
		t.Fatalf("verdict = %+v", v)
	}
	v = p.Decide(id, Request{Argv: []string{"true"}, Secrets: []string{"Q_KEY"}})
	if v.Allowed || v.Rule != RuleSecrets || !strings.Contains(v.Reason, `secret "Q_KEY" is not one of the profile's secrets (GH_TOKEN)`) {
		t.Fatalf("a secret the profile does not list: %+v", v)
	}
	// A session's held secret the profile no longer lists is dropped,
	// not refused.
	v = p.Decide(id, Request{Argv: []string{"true"}, HeldSecrets: []string{"GH_TOKEN", "Q_KEY"}})
	if !v.Allowed || len(v.Secrets) != 1 || v.Secrets[0].Name != "GH_TOKEN" {
		t.Fatalf("held secrets: %+v", v)
	}
	for _, req := range []Request{
		{Argv: []string{"true"}, Secrets: []string{"GH_TOKEN", "GH_TOKEN"}},
		{Argv: []string{"true"}, Secrets: []string{"bad-name"}},
		{Argv: []string{"true"}, Secrets: []string{"GH_TOKEN"}, Env: []string{"GH_TOKEN=x"}},
	} {
		if v := p.Decide(id, req); v.Allowed {
			t.Errorf("%+v allowed", req)
		}
	}
	// A policy whose values were not read grants none.
	unread := mustParse(t, "x.toml", fmt.Sprintf(secretPolicy, "/nonexistent"))
	if v := unread.Decide(id, Request{Argv: []string{"true"}, Secrets: []string{"GH_TOKEN"}}); v.Allowed {
		t.Errorf("an unread value was granted")
	}
}

func TestSecretValueNeverPrints(t *testing.T) {
	s := Secret{Name: "A", Value: SecretValue{v: "hunter2"}}
	var b strings.Builder
	fmt.Fprintf(&b, "%v %+v %#v %s %q %x", s, s, s, s.Value, s.Value, s.Value)
	j, _ := json.Marshal(s)
	b.Write(j)
	slog.New(slog.NewTextHandler(&b, nil)).Info("x", "secret", s.Value, "all", s)
	slog.New(slog.NewJSONHandler(&b, nil)).Info("x", "secret", s.Value, "all", s)
	if strings.Contains(b.String(), "hunter2") || strings.Contains(b.String(), "68756e746572") {
		t.Fatalf("the value printed: %s", b.String())
	}
}
