package netrule

import (
	"net/netip"
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
