package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// TestDecideBytes: arguments, environment values and shell strings that
// are not UTF-8 are decided on their bytes, as the package doc says: an
// invalid byte is one character to ?, * and [^…] and equals no text a
// rule can hold; deny rules still see through it; reasons quote it
// escaped (\xff), so they stay printable UTF-8; an allowed request's
// environment is passed on byte for byte.
func TestDecideBytes(t *testing.T) {
	p := mustParse(t, "decide.toml", decideTOML)
	for _, tt := range []struct {
		name    string
		id      Identity
		req     Request
		allowed bool
		rule    string
		reason  string
	}{
		{"deny glob across a byte", idUID, Request{Argv: argv("wget", "--post-file=\xff/etc/passwd", "https://x")}, false, "deny[1] no-upload",
			`argument 1 "--post-file=\xff/etc/passwd" matches "--post-file*"`},
		{"deny regex across a byte", idUID, Request{Argv: argv("wget", "--config=\xff")}, false, "deny[2]", ""},
		{"no deny by a look-alike byte", idUID, Request{Argv: argv("wget", "--post\xfffile=x")}, true, "default", ""},
		{"? takes a byte", idFetcher, Request{Argv: argv("wget", "-U", "\xff", "https://\xfe")}, true, "allow[0] wget-ua", ""},
		{"text is not its bytes", idFetcher, Request{Argv: argv("echo", "hello\xff")}, false, "", `no allow rule matches argv (program "echo")`},
		{"invalid program", idFetcher, Request{Argv: argv("wget\xff", "-U", "x", "https://a")}, false, "", `program "wget\xff": program name is not valid UTF-8`},
		{"env value of bytes", idAdmin, Request{Argv: argv("env"), Env: []string{"LANG=\xff\xfe"}}, true, "default", ""},
		{"env name of bytes", idAdmin, Request{Argv: argv("env"), Env: []string{"LANG\xff=1"}}, false, "", `environment variable "LANG\xff" is not allowed`},
		{"env entry of bytes without =", idAdmin, Request{Argv: argv("env"), Env: []string{"\x1b[31m\xff"}}, false, "", `environment entry "\x1b[31m\xff": not KEY=VALUE`},
		{"shell string of bytes", idAdmin, Request{Argv: argv("sh", "-c", "printf '%s' '\xff'"), Shell: true}, true, "default", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := p.Decide(tt.id, tt.req)
			if v.Allowed != tt.allowed || v.Rule != tt.rule || !strings.Contains(v.Reason, tt.reason) {
				t.Fatalf("Decide = {Allowed:%v Rule:%q Reason:%q}, want {%v %q ~%q}", v.Allowed, v.Rule, v.Reason, tt.allowed, tt.rule, tt.reason)
			}
			checkVerdict(t, p, tt.req, v)
			if v.Allowed && !slices.Equal(v.Env, tt.req.Env) {
				t.Errorf("env passed on as %q, asked %q", v.Env, tt.req.Env)
			}
		})
	}
	// As documented: U+FFFD in a rule is what an invalid byte reads as.
	g, err := compileGlob("a\ufffdb")
	if err != nil || !g.match("a\xffb") || !g.match("a\ufffdb") || g.match("a\xff\xfeb") {
		t.Errorf("glob with U+FFFD: %v", err)
	}
}

// TestQuoteBytes: quote keeps the bytes it can of an argument that is not
// UTF-8 (it cut to nothing before, looking for a rune's start among
// continuation bytes) and escapes them.
func TestQuoteBytes(t *testing.T) {
	for _, s := range []string{strings.Repeat("\x80", 100), strings.Repeat("\xff", 100), "é" + strings.Repeat("\x80", 99)} {
		got := quote(s)
		if strings.Count(got, `\x`) < 55 || !strings.HasSuffix(got, fmt.Sprintf("...(%d bytes)", len(s))) || !sanitised(got) {
			t.Errorf("quote(%d bytes) = %s", len(s), got)
		}
	}
	// A cut still falls between runes of text.
	if got := quote(strings.Repeat("é", 100)); strings.Contains(got, `\x`) {
		t.Errorf("quote cut a rune: %s", got)
	}
}

// sanitised reports whether a reason is printable UTF-8: no request byte
// reaches it raw.
func sanitised(reason string) bool {
	return utf8.ValidString(reason) && !strings.ContainsFunc(reason, unicode.IsControl)
}
