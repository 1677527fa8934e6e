package netstack

import (
	"net/netip"
	"testing"
)

func TestParseHosts(t *testing.T) {
	h, err := ParseHosts("# test internet\n198.51.100.10 allowed.test Www.Allowed.TEST.\n\n2001:db8::1 allowed.test # v6\n")
	if err != nil {
		t.Fatal(err)
	}
	if a := h["allowed.test"]; len(a) != 2 || a[0] != netip.MustParseAddr("198.51.100.10") {
		t.Fatalf("%v", h)
	}
	if len(h["www.allowed.test"]) != 1 {
		t.Fatalf("%v", h)
	}
	for _, bad := range []string{"198.51.100.10\n", "nope allowed.test\n", "198.51.100.10 bad_name!\n"} {
		if _, err := ParseHosts(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
