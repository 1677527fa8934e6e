package netrule

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	cases := []struct {
		in     string
		ok     bool
		name   string
		suffix bool
		prefix string
		port   uint16
	}{
		{"example.com:443", true, "example.com", false, "", 443},
		{"Example.COM.:80", true, "example.com", false, "", 80},
		{"*.wikipedia.org:443", true, "wikipedia.org", true, "", 443},
		{"example.com:*", true, "example.com", false, "", 0},
		{"203.0.113.0/24:80", true, "", false, "203.0.113.0/24", 80},
		{"203.0.113.7:8080", true, "", false, "203.0.113.7/32", 8080},
		{"[2001:db8::/32]:443", true, "", false, "2001:db8::/32", 443},
		{"example.com", false, "", false, "", 0},
		{"example.com:0", false, "", false, "", 0},
		{"example.com:65536", false, "", false, "", 0},
		{"*.com:443", false, "", false, "", 0},
		{"exa mple.com:443", false, "", false, "", 0},
		{"-bad.com:443", false, "", false, "", 0},
		{"2001:db8::1:443", false, "", false, "", 0},
		{":443", false, "", false, "", 0},
		{"10.0.0.0/33:1", false, "", false, "", 0},
	}
	for _, c := range cases {
		r, err := ParseRule(c.in)
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v", c.in, err)
			continue
		}
		if !c.ok {
			continue
		}
		p := ""
		if r.Prefix.IsValid() {
			p = r.Prefix.String()
		}
		if r.Name != c.name || r.Suffix != c.suffix || p != c.prefix || r.Port != c.port {
			t.Errorf("%q: got %+v", c.in, r)
		}
	}
}

func TestRulesMatch(t *testing.T) {
	rs, err := ParseRules([]string{"*.wikipedia.org:443", "example.com:80", "any.test:*", "198.51.100.0/24:443"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		port uint16
		want bool
	}{
		{"en.wikipedia.org", 443, true},
		{"wikipedia.org", 443, false}, // *. matches subdomains only
		{"en.wikipedia.org", 80, false},
		{"evilwikipedia.org", 443, false},
		{"example.com", 80, true},
		{"example.com", 443, false},
		{"www.example.com", 80, false},
		{"any.test", 22, true},
		{"example.com", 0, true}, // DNS: allowed on some port
		{"nope.test", 0, false},
	} {
		if _, got := rs.AllowsName(c.name, c.port); got != c.want {
			t.Errorf("%s:%d = %v", c.name, c.port, got)
		}
	}
	if _, ok := rs.AllowsAddr(netip.MustParseAddr("198.51.100.9"), 443); !ok {
		t.Error("range rule does not match")
	}
	if _, ok := rs.AllowsAddr(netip.MustParseAddr("::ffff:198.51.100.9"), 443); !ok {
		t.Error("range rule does not match the v4-mapped form")
	}
	if _, ok := rs.AllowsAddr(netip.MustParseAddr("198.51.100.9"), 80); ok {
		t.Error("range rule matches another port")
	}
	if _, err := ParseRules([]string{"a.test:1", "bad", "also bad:x"}); err == nil {
		t.Error("bad rules accepted")
	}
}

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"example.com:443", "*.a.b:*", "10.0.0.0/8:80", "[::1/128]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRule(s)
		if err == nil && r.Name == "" && !r.Prefix.IsValid() {
			t.Fatalf("%q: a rule that matches nothing", s)
		}
	})
}

func mustRule(t testing.TB, s string) Rule {
	t.Helper()
	r, err := ParseRule(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRuleString(t *testing.T) {
	for in, want := range map[string]string{
		"Example.COM.:443":       "example.com:443",
		"*.example.com:*":        "*.example.com:*",
		"203.0.113.7:80":         "203.0.113.7:80",
		"203.0.113.9/24:80":      "203.0.113.0/24:80",
		"[2001:db8::1]:443":      "[2001:db8::1]:443",
		"[2001:db8::/32]:443":    "[2001:db8::/32]:443",
		"[::ffff:1.2.3.4/128]:1": "[::ffff:1.2.3.4/128]:1",
	} {
		r := mustRule(t, in)
		if got := r.String(); got != want {
			t.Errorf("%q: String %q, want %q", in, got, want)
		}
		back := mustRule(t, r.String())
		back.Text, r.Text = "", ""
		if back != r {
			t.Errorf("%q: read back as %+v, was %+v", in, back, r)
		}
	}
}

func TestWithinAndIntersect(t *testing.T) {
	cases := []struct {
		r, o   string
		within bool
		common string // Intersect(r, o); "" for nothing
	}{
		{"a.example.com:443", "a.example.com:443", true, "a.example.com:443"},
		{"a.example.com:443", "a.example.com:*", true, "a.example.com:443"},
		{"a.example.com:*", "a.example.com:443", false, "a.example.com:443"},
		{"a.example.com:80", "a.example.com:443", false, ""},
		{"a.example.com:443", "*.example.com:443", true, "a.example.com:443"},
		{"example.com:443", "*.example.com:443", false, ""}, // *. is subdomains only
		{"*.a.example.com:443", "*.example.com:443", true, "*.a.example.com:443"},
		{"*.example.com:443", "*.example.com:443", true, "*.example.com:443"},
		{"*.example.com:443", "a.example.com:443", false, "a.example.com:443"},
		{"*.example.com:443", "*.a.example.com:*", false, "*.a.example.com:443"},
		{"evilexample.com:443", "*.example.com:443", false, ""},
		{"b.test:443", "a.test:443", false, ""},
		{"203.0.113.7:80", "203.0.113.0/24:80", true, "203.0.113.7:80"},
		{"203.0.113.0/24:80", "203.0.113.0/25:*", false, "203.0.113.0/25:80"},
		{"203.0.113.0/24:80", "198.51.100.0/24:80", false, ""},
		{"[2001:db8::1]:443", "[2001:db8::/32]:*", true, "[2001:db8::1]:443"},
		{"[::ffff:203.0.113.7/128]:80", "203.0.113.0/24:80", false, ""},
		{"203.0.113.7:80", "example.com:80", false, ""}, // an address is not a name
		{"example.com:80", "0.0.0.0/0:80", false, ""},
	}
	for _, c := range cases {
		r, o := mustRule(t, c.r), mustRule(t, c.o)
		if got := r.Within(o); got != c.within {
			t.Errorf("%s within %s = %v", c.r, c.o, got)
		}
		got, ok := Intersect(r, o)
		if ok != (c.common != "") || ok && got.Text != c.common {
			t.Errorf("%s ∩ %s = %q %v, want %q", c.r, c.o, got.Text, ok, c.common)
		}
		if back, _ := Intersect(o, r); back.Text != got.Text {
			t.Errorf("%s ∩ %s is not symmetric: %q and %q", c.r, c.o, got.Text, back.Text)
		}
	}
}

func TestRulesIntersect(t *testing.T) {
	profile, err := ParseRules([]string{"*.debian.org:80", "repo.test:80", "repo.test:443", "203.0.113.0/24:*"})
	if err != nil {
		t.Fatal(err)
	}
	lock, err := ParseRules([]string{"deb.debian.org:*", "repo.test:443", "203.0.113.128/25:22", "other.test:80"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range profile.Intersect(lock) {
		got = append(got, r.Text)
	}
	want := []string{"deb.debian.org:80", "repo.test:443", "203.0.113.128/25:22"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("intersection %q, want %q", got, want)
	}
	if r, ok := profile.Covering(mustRule(t, "security.debian.org:80")); !ok || r.Text != "*.debian.org:80" {
		t.Errorf("covering rule %+v %v", r, ok)
	}
	if _, ok := profile.Covering(mustRule(t, "repo.test:*")); ok {
		t.Error("repo.test:* is covered by rules on two of its ports")
	}
	if len(profile.Intersect(nil)) != 0 {
		t.Error("the intersection with no rules allows something")
	}
}

// FuzzIntersect checks Within and Intersect against matching itself: a
// destination the common rule allows is allowed by both rules, and one
// both allow is allowed by the common rule; a rule within another allows
// nothing the other does not.
func FuzzIntersect(f *testing.F) {
	for _, s := range [][3]string{
		{"*.example.com:443", "a.example.com:*", "a.example.com"},
		{"203.0.113.0/24:80", "203.0.113.7:*", "203.0.113.7"},
		{"[2001:db8::/32]:443", "[2001:db8::1]:443", "2001:db8::1"},
		{"example.com:80", "example.com:80", "example.com"},
	} {
		f.Add(s[0], s[1], s[2], uint16(443))
	}
	f.Fuzz(func(t *testing.T, a, b, dest string, port uint16) {
		ra, err1 := ParseRule(a)
		rb, err2 := ParseRule(b)
		if err1 != nil || err2 != nil {
			return
		}
		allows := func(r Rule) bool {
			if ad, err := netip.ParseAddr(dest); err == nil {
				return r.MatchAddr(ad, port)
			}
			return r.MatchName(NormalizeName(dest), port)
		}
		c, ok := Intersect(ra, rb)
		both := allows(ra) && allows(rb)
		switch {
		case !ok && both:
			t.Fatalf("%s and %s share nothing, yet both allow %s:%d", a, b, dest, port)
		case ok && allows(c) != both:
			t.Fatalf("%s ∩ %s = %s: allows %s:%d %v, the two rules %v", a, b, c.Text, dest, port, allows(c), both)
		case ok && (!c.Within(ra) || !c.Within(rb)):
			t.Fatalf("%s ∩ %s = %s is not within both", a, b, c.Text)
		case ra.Within(rb) && allows(ra) && !allows(rb):
			t.Fatalf("%s within %s, yet only it allows %s:%d", a, b, dest, port)
		}
		if ok {
			back, err := ParseRule(c.Text)
			back.Text, c.Text = "", ""
			if err != nil || back != c {
				t.Fatalf("%s ∩ %s: its text reads back as %+v %v", a, b, back, err)
			}
		}
	})
}
