package netstack

import (
	"net/netip"
	"testing"
)

func TestClassify(t *testing.T) {
	for addr, want := range map[string]bool{ // special?
		"127.0.0.1": true, "10.1.2.3": true, "172.16.0.1": true, "172.32.0.1": false, "192.168.1.1": true,
		"100.64.0.1": true, "169.254.169.254": true, "224.0.0.251": true, "255.255.255.255": true, "0.0.0.0": true,
		"8.8.8.8": false, "198.51.100.10": false, "203.0.113.5": false,
		"::1": true, "::": true, "fe80::1": true, "fd00::1": true, "ff02::1": true, "2001:4860::8888": false,
		"::ffff:127.0.0.1": true, "::ffff:8.8.8.8": false, "64:ff9b::a00:1": true, "64:ff9b::808:808": false,
		"2002:a00:1::": true, "2002:808:808::": false,
	} {
		c := Classify(netip.MustParseAddr(addr))
		if (c != "") != want {
			t.Errorf("%s: class %q", addr, c)
		}
	}
	if Classify(netip.Addr{}) == "" {
		t.Error("the zero address is ordinary")
	}
}
