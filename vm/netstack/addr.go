package netstack

import "net/netip"

// specialRanges are destinations refused unless the operator allows the
// range explicitly: the host itself, the LAN, the provider's network and
// cloud metadata, and addresses that are not unicast destinations.
var specialRanges = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "this-network"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "shared address space (CGNAT)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (incl. cloud metadata)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private (RFC 1918)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "IETF protocol assignments"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private (RFC 1918)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "benchmarking"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("::/128"), "unspecified"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "local-use NAT64"},
	{netip.MustParsePrefix("100::/64"), "discard-only"},
	{netip.MustParsePrefix("fc00::/7"), "unique local (private)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("fec0::/10"), "site-local (deprecated)"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// Classify returns why a is not an ordinary public unicast destination,
// or "" when it is. IPv4-mapped IPv6 addresses are classified as IPv4, and
// the NAT64 and 6to4 forms of special IPv4 addresses as those addresses.
func Classify(a netip.Addr) string {
	if !a.IsValid() {
		return "invalid"
	}
	a = a.Unmap()
	if a.Is6() {
		b := a.As16()
		switch {
		case netip.MustParsePrefix("64:ff9b::/96").Contains(a):
			if c := Classify(netip.AddrFrom4([4]byte(b[12:16]))); c != "" {
				return c + " (via NAT64)"
			}
		case netip.MustParsePrefix("2002::/16").Contains(a):
			if c := Classify(netip.AddrFrom4([4]byte(b[2:6]))); c != "" {
				return c + " (via 6to4)"
			}
		}
	}
	if a.Zone() != "" {
		return "scoped address"
	}
	for _, r := range specialRanges {
		if r.prefix.Contains(a) {
			return r.class
		}
	}
	if a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		return "broadcast"
	}
	return ""
}
