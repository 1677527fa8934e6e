package netstack

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/vmgate/vmgate/policy/netrule"
)

// The operator's table of pinned names (Config.Hosts; vmgated serve
// --net-hosts): looked up before the host's resolver, and still subject to
// the allowlist and the address checks.

// ParseHosts reads a hosts(5)-style table: an address, then the names it
// answers for; '#' starts a comment.
func ParseHosts(text string) (map[string][]netip.Addr, error) {
	out := map[string][]netip.Addr{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		a, err := netip.ParseAddr(f[0])
		if err != nil || len(f) < 2 {
			return nil, fmt.Errorf("hosts line %d: want an address and at least one name", n)
		}
		for _, name := range f[1:] {
			nn := netrule.NormalizeName(name)
			if nn == "" {
				return nil, fmt.Errorf("hosts line %d: %q is not a DNS name", n, name)
			}
			out[nn] = append(out[nn], a.Unmap())
		}
	}
	return out, sc.Err()
}

// LoadHosts reads a hosts table from a file.
func LoadHosts(path string) (map[string][]netip.Addr, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("net hosts: %w", err)
	}
	h, err := ParseHosts(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return h, nil
}
