package names

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
)

func TestSession(t *testing.T) {
	for s, ok := range map[string]bool{
		"work": true, "a.b_c-d": true, ".hidden": true, "-x": true, strings.Repeat("a", 64): true,
		"": false, ".": false, "..": false, "a/b": false, "a b": false, "é": false, strings.Repeat("a", 65): false, "a\x00": false,
	} {
		if Session(s) != ok {
			t.Errorf("Session(%q) = %v, want %v", s, !ok, ok)
		}
	}
}

func TestImage(t *testing.T) {
	for s, ok := range map[string]bool{
		"default": true, "debian-12.1": true, "0x": true, strings.Repeat("a", 64): true,
		"": false, ".x": false, "-x": false, "_x": false, "..": false, "a/b": false, strings.Repeat("a", 65): false,
	} {
		if Image(s) != ok {
			t.Errorf("Image(%q) = %v, want %v", s, !ok, ok)
		}
	}
}

// TestRules: the rules' texts say what Session and Image check: the
// bound MaxLen, the characters of Charset (one character names: every
// one of Charset but "." is a session name, no other is), and Image's
// first character.
func TestRules(t *testing.T) {
	bound := fmt.Sprintf("1 to %d of %s, ", MaxLen, Charset)
	for _, r := range []string{SessionRule, ImageRule} {
		if !strings.HasPrefix(r, bound) {
			t.Errorf("rule %q does not start with %q", r, bound)
		}
	}
	if !strings.HasSuffix(SessionRule, "not . or ..") || !strings.HasSuffix(ImageRule, "starting with a letter or digit") {
		t.Errorf("rules %q, %q", SessionRule, ImageRule)
	}
	charset := regexp.MustCompile("^" + Charset + "$")
	for c := range 256 {
		s := string(rune(c))
		if want := charset.MatchString(s) && s != "."; Session(s) != want {
			t.Errorf("Session(%q) = %v, want %v (Charset %s)", s, !want, want, Charset)
		}
		if want := charset.MatchString(s) && !strings.ContainsAny(s, "._-"); Image(s) != want {
			t.Errorf("Image(%q) = %v, want %v", s, !want, want)
		}
	}
}

func FuzzNames(f *testing.F) {
	for _, s := range []string{"work", "..", "a/b", "-x", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Session(s) && (strings.ContainsAny(s, "/\x00") || s == "." || s == ".." || len(s) > MaxLen) {
			t.Errorf("Session(%q) accepted a name that is not one path element", s)
		}
		if Image(s) && !Session(s) {
			t.Errorf("Image(%q) is wider than Session", s)
		}
	})
}
