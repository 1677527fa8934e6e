package policy

import (
	"errors"
	"os"
	"path"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestGlob(t *testing.T) {
	tests := []struct {
		pattern, s string
		want       bool
	}{
		{"--post-file*", "--post-file=/etc/passwd", true}, // * crosses "/"
		{"--post-file*", "--post-file", true},
		{"--post-file*", "-post-file", false},
		{"https://?*", "https://a/b/c", true},
		{"https://?*", "https://", false},
		{"https://*", "http://a", false},
		{"/tmp/?*", "/tmp/a/b", true},
		{"a?c", "a/c", true}, // ? crosses "/"
		{"a?c", "a\u00e9c", true},
		{"[abc]x", "bx", true},
		{"[^abc]x", "dx", true},
		{"[^abc]x", "ax", false},
		{"[a-c]", "b", true},
		{"[\\]]", "]", true},
		{"\\*", "*", true},
		{"\\*", "a", false},
		{"*", "", true},
		{"", "", true},
		{"", "a", false},
		{"a*b*c", "a/x/b/y/c", true},
		{"a.b", "axb", false}, // regexp metacharacters are literal
		{"(x)+", "(x)+", true},
		{"$x", "$x", true},
		{"x", "x\n", false},
		{"x*", "x\ny", true},
		{"wget", "wg\u0435t", false},
	}
	for _, tt := range tests {
		g, err := compileGlob(tt.pattern)
		if err != nil {
			t.Errorf("compileGlob(%q): %v", tt.pattern, err)
			continue
		}
		if got := g.match(tt.s); got != tt.want {
			t.Errorf("glob %q on %q = %v, want %v", tt.pattern, tt.s, got, tt.want)
		}
	}
	for _, bad := range []string{"[", "[]", "[^]", "a\\", "[a-]", "[-a]", "[z-a]", "x\x00", "\xff"} {
		if _, err := compileGlob(bad); err == nil {
			t.Errorf("compileGlob(%q) succeeded", bad)
		}
	}
	if _, err := compileGlob("["); !errors.Is(err, path.ErrBadPattern) {
		t.Errorf("compileGlob([) = %v, want path.ErrBadPattern", err)
	}
}

// FuzzGlob checks the translation against path.Match on names without "/",
// where the two must agree.
func FuzzGlob(f *testing.F) {
	for _, s := range [][2]string{
		{"*", "abc"}, {"a*b?c", "axxbyc"}, {"[a-z]*", "q"}, {"[^a]", "b"}, {"\\[", "["},
		{"[\\-\\]]", "-"}, {"*x*", "yxy"}, {"?", "é"}, {"[é-ü]", "ö"}, {"\\", ""}, {"[", "["},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, name string) {
		g, err := compileGlob(pattern)
		_, perr := path.Match(pattern, name)
		if perr != nil && err == nil {
			t.Fatalf("compileGlob(%q) accepted what path.Match rejects: %v", pattern, perr)
		}
		if err != nil || strings.Contains(name, "/") || !utf8.ValidString(name) {
			return
		}
		want, _ := path.Match(pattern, name)
		if got := g.match(name); got != want {
			t.Fatalf("glob %q on %q = %v, path.Match = %v (regexp %s)", pattern, name, got, want, g.re)
		}
	})
}

// parseSeeds are policy files for FuzzParse: the shipped ones, the table
// cases of TestParseErrors' kind, and odd TOML.
func parseSeeds(t testing.TB) []string {
	seeds := []string{decideTOML, sshTOML, minimal, "", "version = 1", "version = 1\nprofile = [{name = \"a\", match = {any = true}}]\n",
		minimal + "[[profile.allow]]\nargs = [\"...\"]\n[[profile.deny]]\nargs_regex = 'x'\nargs_any = ['[a-z]*']\n",
		minimal + "output_limit = \"1MiB\"\n[profile.timeout]\ndefault = \"1s\"\nmax = \"2s\"\n",
		"version = 1\n[[profile]]\nname = \"a\"\nmatch = { any = true }\ncpus = \"two\"\n[[profile]]\nname = \"a\"\n",
		"[[profile]]\n[[profile]]\n[[profile.deny]]\n",
		minimal + "\"a.b\" = 1\n\"\" = 2\n\"-\" = 3\n\"x,y\" = 4\n",
		"version = 1\nversion.x = 2\n",
		minimal + "[profile.Timeout]\nMax = \"1s\"\n",
	}
	for _, f := range []string{"example.toml", "default.toml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, string(b))
	}
	return seeds
}

func FuzzParse(f *testing.F) {
	for _, s := range parseSeeds(f) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("fuzz.toml", data)
		if err != nil {
			if p != nil {
				t.Fatal("Parse returned a policy and an error")
			}
			if !strings.HasPrefix(err.Error(), "fuzz.toml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("parsed policy does not validate: %v", err)
		}
		if p.Explain() == "" {
			t.Fatal("empty explanation")
		}
		req := Request{Argv: []string{"sh", "-c", "x"}, Shell: true, Session: "s", Env: []string{"LANG=C"}}
		for _, prof := range p.profiles {
			id := Identity{}
			if len(prof.match.uids) > 0 {
				id.UID = prof.match.uids[0]
			}
			checkVerdict(t, p, req, p.Decide(id, req))
			key := Identity{SSH: &SSHKey{Profile: prof.name}}
			checkVerdict(t, p, req, p.Decide(key, req))
			login := Request{Argv: []string{"bash", "-l"}, Interactive: true}
			checkVerdict(t, p, login, p.Decide(key, login))
			if (p.CheckKeyProfile(prof.name) == nil) != prof.match.acceptsKeys(DoorSSH) {
				t.Fatalf("CheckKeyProfile(%q) disagrees with the match table", prof.name)
			}
			if (p.CheckDoorKeyProfile(DoorE2B, prof.name) == nil) != prof.match.acceptsKeys(DoorE2B) {
				t.Fatalf("CheckDoorKeyProfile(e2b, %q) disagrees with the match table", prof.name)
			}
		}
	})
}

// decideSeed is one request for FuzzDecide, in the fuzzer's flat encoding.
type decideSeed struct {
	argv, env, session string // argv and env are split on "\x1e"
	shell              bool
	timeout            int64
	uid, gid           uint32
	user, groups       string // groups split on ","
	image              string
}

func FuzzDecide(f *testing.F) {
	seeds := []decideSeed{
		{argv: "wget\x1e-U\x1eua\x1ehttps://example.com", groups: "vmgate-agents"},
		{argv: "wget\x1e--\x1e-U\x1eua\x1ehttps://example.com", user: "llama"},
		{argv: "curl\x1e-A\x1eua\x1e-o\x1e/tmp/../etc/x\x1ehttps://a", user: "llama", env: "LANG=C\x1eLANG=D"},
		{argv: "sh\x1e-c\x1erm -rf /", shell: true, session: "s1", groups: "vmgate-admins", timeout: int64(time.Hour)},
		{argv: "/usr/bin/../bin/sh", groups: "vmgate-admins"},
		{argv: "../../bin/sh", groups: "vmgate-admins"},
		{argv: "wg\u0435t\x1e-U\x1eua\x1ehttps://a", groups: "vmgate-agents"},
		{argv: "", groups: "vmgate-admins"},
		{argv: " ", groups: "vmgate-admins"},
		{argv: "/usr/bin/", groups: "vmgate-admins"},
		{argv: "ls\x00", groups: "vmgate-admins"},
		{argv: "ls", env: "TERM=xterm\x1eLC_ALL=C\x1eX=\x00", groups: "vmgate-admins"},
		{argv: "ls", session: "../x", groups: "vmgate-admins", timeout: -1},
		{argv: "ls", uid: 0, user: "root"},
		{argv: "ls", env: "=\x1eA", timeout: int64(2 * time.Hour), groups: "vmgate-admins"},
		{argv: "wget\x1e--post-file=\xff\x1e\x80\x80", env: "LANG=\xff\x1eL\xfe=1", user: "llama"},
		{argv: "ls", groups: "wheel", image: "py"},
		{argv: "ls", groups: "wheel", image: "node"},
		{argv: "ls", groups: "wheel", image: "py@sha256:00"},
		{argv: "ls", uid: 1001, image: "default"},
	}
	for _, s := range seeds {
		f.Add(s.argv, s.env, s.session, s.shell, s.timeout, s.uid, s.gid, s.user, s.groups, s.image)
	}
	policies := []*Policy{loadExample(f), Default(), mustParse(f, "decide.toml", decideTOML)}
	f.Fuzz(func(t *testing.T, argvS, envS, session string, shell bool, timeout int64, uid, gid uint32, user, groups, image string) {
		req := Request{Shell: shell, Session: session, Timeout: time.Duration(timeout), Image: image}
		if argvS != "" || !shell {
			req.Argv = strings.Split(argvS, "\x1e")
		}
		if envS != "" {
			req.Env = strings.Split(envS, "\x1e")
		}
		id := Identity{UID: uid, GID: gid, User: user, Group: user}
		if groups != "" {
			id.Groups = strings.Split(groups, ",")
		}
		argvCopy := append([]string(nil), req.Argv...)
		for _, p := range policies {
			v := p.Decide(id, req)
			checkVerdict(t, p, req, v)
			if again := p.Decide(id, req); !reflect.DeepEqual(v, again) {
				t.Fatalf("Decide is not deterministic: %+v then %+v", v, again)
			}
			if v.Allowed && len(req.Argv) > MaxArgs {
				t.Fatal("allowed an oversized argv")
			}
		}
		if !reflect.DeepEqual(argvCopy, req.Argv) {
			t.Fatal("Decide changed the request")
		}
	})
}
