// Package netrule is the grammar of a profile's network allowlist: rules
// such as "example.com:443", "*.example.com:443" or "203.0.113.0/24:80",
// parsed and matched, and the normal form of a DNS name. The policy
// compiles a profile's allowlist into Rules; the guest network
// (vm/netstack) enforces them. It uses the standard library only, so that
// importing the policy never links a network stack.
package netrule

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/internal/names"
)

// Rule allows egress to a name pattern or an address range, on one port
// or all ports. Syntax: "example.com:443", "*.example.com:443" (any
// subdomain, not the name itself), "example.com:*", "203.0.113.0/24:80",
// "[2001:db8::/32]:443".
type Rule struct {
	Text   string
	Name   string // lower case, no trailing dot; "" for a range rule
	Suffix bool   // Name was "*.name": matches subdomains only
	Prefix netip.Prefix
	Port   uint16 // 0: any port
}

// ParseRule parses one allowlist entry.
func ParseRule(s string) (Rule, error) {
	r := Rule{Text: s}
	host, port, err := splitHostPort(s)
	if err != nil {
		return r, fmt.Errorf("network rule %q: %w", s, err)
	}
	if port != "*" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 {
			return r, fmt.Errorf("network rule %q: port %q: want 1-65535 or *", s, port)
		}
		r.Port = uint16(n)
	}
	if strings.Contains(host, "/") {
		p, err := netip.ParsePrefix(host)
		if err != nil {
			return r, fmt.Errorf("network rule %q: %w", s, err)
		}
		r.Prefix = p.Masked()
		return r, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		r.Prefix = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		return r, nil
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	if rest, ok := strings.CutPrefix(name, "*."); ok {
		r.Suffix, name = true, rest
	}
	if err := names.CheckHost(name); err != nil {
		return r, fmt.Errorf("network rule %q: %w", s, err)
	}
	if strings.Count(name, ".") == 0 && r.Suffix {
		return r, fmt.Errorf("network rule %q: a wildcard needs at least a second-level name (*.example.com)", s)
	}
	r.Name = name
	return r, nil
}

func splitHostPort(s string) (host, port string, err error) {
	if strings.HasPrefix(s, "[") {
		end := strings.Index(s, "]")
		if end < 0 || !strings.HasPrefix(s[end+1:], ":") {
			return "", "", errors.New("want [address]:port")
		}
		return s[1:end], s[end+2:], nil
	}
	i := strings.LastIndex(s, ":")
	if i <= 0 || i == len(s)-1 {
		return "", "", errors.New("want host:port (port may be *)")
	}
	if strings.Count(s[:i], ":") > 0 {
		return "", "", errors.New("write IPv6 addresses in brackets: [2001:db8::/32]:443")
	}
	return s[:i], s[i+1:], nil
}

// NormalizeName lowers a DNS name and drops its trailing dot; it returns
// "" for a name that is not a valid DNS name (names.Host).
func NormalizeName(n string) string { return names.Host(n) }

// MatchName reports whether the rule allows name (normalised) on port.
func (r Rule) MatchName(name string, port uint16) bool {
	if r.Name == "" || (r.Port != 0 && r.Port != port) {
		return false
	}
	if r.Suffix {
		return strings.HasSuffix(name, "."+r.Name)
	}
	return name == r.Name
}

// MatchAddr reports whether the rule's range allows a on port.
func (r Rule) MatchAddr(a netip.Addr, port uint16) bool {
	return r.Prefix.IsValid() && (r.Port == 0 || r.Port == port) && r.Prefix.Contains(a.Unmap())
}

// Rules is a profile's allowlist.
type Rules []Rule

// Egress is what a profile lets a VM's network do: the policy compiles it
// from the profile's [profile.network] table, the guest network enforces
// it. Zero limits get the enforcer's defaults.
type Egress struct {
	Rules         Rules          // TCP egress allowlist (names and ranges)
	AllowedRanges []netip.Prefix // special ranges allowed anyway (a relaxation)
	MaxConns      int            // concurrent connections per VM
	MaxBytes      int64          // bytes per VM, both directions
	ConnectRate   int            // new connections per minute per VM
}

// Allowlist is e as every record of it spells it (the audit log's
// decisions, receipts): each rule's text, then each allowed range marked
// "(allowed range)". Never nil.
func (e Egress) Allowlist() []string {
	out := make([]string, 0, len(e.Rules)+len(e.AllowedRanges))
	for _, r := range e.Rules {
		out = append(out, r.Text)
	}
	for _, p := range e.AllowedRanges {
		out = append(out, p.String()+" (allowed range)")
	}
	return out
}

// ParseRules parses every entry, reporting all errors.
func ParseRules(list []string) (Rules, error) {
	var rs Rules
	var errs []error
	for _, s := range list {
		r, err := ParseRule(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rs = append(rs, r)
	}
	return rs, errors.Join(errs...)
}

// AllowsName returns the first rule allowing name on port (any port when
// port is 0: used for DNS, which answers for names allowed on some port).
func (rs Rules) AllowsName(name string, port uint16) (Rule, bool) {
	for _, r := range rs {
		if r.Name == "" {
			continue
		}
		if port == 0 {
			rr := r
			rr.Port = 0
			if rr.MatchName(name, 0) {
				return r, true
			}
			continue
		}
		if r.MatchName(name, port) {
			return r, true
		}
	}
	return Rule{}, false
}

// AllowsAddr returns the first range rule allowing a on port.
func (rs Rules) AllowsAddr(a netip.Addr, port uint16) (Rule, bool) {
	for _, r := range rs {
		if r.MatchAddr(a, port) {
			return r, true
		}
	}
	return Rule{}, false
}

// String is the rule in its normal form, which ParseRule reads back as
// the same rule: "example.com:443", "*.example.com:*", "203.0.113.0/24:80",
// "203.0.113.7:80", "[2001:db8::/32]:443".
func (r Rule) String() string {
	port := "*"
	if r.Port != 0 {
		port = strconv.Itoa(int(r.Port))
	}
	if r.Name != "" {
		if r.Suffix {
			return "*." + r.Name + ":" + port
		}
		return r.Name + ":" + port
	}
	p := r.Prefix
	host := p.String()
	if p.IsSingleIP() && !p.Addr().Is4In6() {
		host = p.Addr().String() // ParseRule reads a single address as its own range
	}
	if p.Addr().Is6() {
		host = "[" + host + "]"
	}
	return host + ":" + port
}

// Within reports whether o allows everything r allows: every name, or
// every address, on every port. A name rule is never within a range rule,
// nor a range rule within a name rule (a name allowed is no address
// allowed, and the other way round).
func (r Rule) Within(o Rule) bool {
	if o.Port != 0 && o.Port != r.Port {
		return false
	}
	switch {
	case r.Name != "" && o.Name != "":
		if !o.Suffix {
			return !r.Suffix && r.Name == o.Name
		}
		return strings.HasSuffix(r.Name, "."+o.Name) || r.Suffix && r.Name == o.Name
	case r.Prefix.IsValid() && o.Prefix.IsValid():
		return r.Prefix.Addr().Is4() == o.Prefix.Addr().Is4() && o.Prefix.Bits() <= r.Prefix.Bits() && o.Prefix.Contains(r.Prefix.Addr())
	}
	return false
}

// Intersect returns the rule that allows what both r and o allow, and
// false when they share nothing. Names and ranges nest or are disjoint,
// so the common part of two rules is always one rule: the narrower name
// or range, on the narrower port.
func Intersect(r, o Rule) (Rule, bool) {
	port := r.Port
	switch {
	case r.Port == 0:
		port = o.Port
	case o.Port != 0 && o.Port != r.Port:
		return Rule{}, false
	}
	rp, op := r, o
	rp.Port, op.Port = 0, 0
	var out Rule
	switch {
	case rp.Within(op):
		out = rp
	case op.Within(rp):
		out = op
	default:
		return Rule{}, false
	}
	out.Port = port
	out.Text = out.String()
	return out, true
}

// Covering returns the first rule of rs that r is within.
func (rs Rules) Covering(r Rule) (Rule, bool) {
	for _, o := range rs {
		if r.Within(o) {
			return o, true
		}
	}
	return Rule{}, false
}

// Intersect returns rules that allow what both rs and other allow: the
// common part of each pair, without repeats.
func (rs Rules) Intersect(other Rules) Rules {
	var out Rules
	seen := map[string]bool{}
	for _, a := range rs {
		for _, b := range other {
			if c, ok := Intersect(a, b); ok && !seen[c.Text] {
				seen[c.Text] = true
				out = append(out, c)
			}
		}
	}
	return out
}
