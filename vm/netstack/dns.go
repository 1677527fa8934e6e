package netstack

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/policy/netrule"
)

// DNSVerdict is what the resolver decided for one query, for the log and
// the audit.
type DNSVerdict struct {
	Name    string       // normalised query name ("" if malformed)
	Type    string       // "A", "AAAA", …
	Allowed bool         // the name is on the allowlist
	Rule    string       // the rule that allowed it
	Addrs   []netip.Addr // addresses answered
	Refused []netip.Addr // addresses dropped (special ranges)
	Reason  string       // why nothing was answered, if so
	// Probe marks the guest agent's readiness probe (a query for
	// agentproto.ReadinessName): answered here with NXDOMAIN, never
	// looked up and not audited.
	Probe bool
}

// LookupHost looks a guest's name up with the host's resolver as a fully
// qualified name (with a trailing dot), so the host's search domains are
// never tried: a name under an allowed wildcard that does not exist must
// not become name.<the host's domain>, whose internal answer would then
// be an allowed destination.
func LookupHost(ctx context.Context, name string) ([]netip.Addr, error) {
	return hostResolver.LookupNetIP(ctx, "ip", strings.TrimSuffix(name, ".")+".")
}

// hostResolver is Go's own resolver (/etc/resolv.conf, /etc/hosts), never
// the C library's: the netstack's jail holds those two files and no NSS
// modules.
var hostResolver = &net.Resolver{PreferGo: true}

// Resolver looks a name up for the guest (the daemon's resolver, or a
// fixed table in tests).
type Resolver func(ctx context.Context, name string) ([]netip.Addr, error)

// DNS answers the guest's DNS queries itself: only names the rules allow
// (on any port) are resolved, and only to addresses that are ordinary
// public unicast or inside a range the operator allows.
type DNS struct {
	Rules   netrule.Rules
	Allowed []netip.Prefix // special ranges the operator allows anyway
	Resolve Resolver
	TTL     uint32 // answer TTL in seconds (default 30)
}

// maxQuery bounds a query packet.
const maxQuery = 4096

// Handle answers one query packet; it returns nil when the packet is not
// worth an answer (unparseable, not a query).
func (d *DNS) Handle(ctx context.Context, query []byte) ([]byte, DNSVerdict) {
	var v DNSVerdict
	if len(query) > maxQuery {
		return nil, v
	}
	var q dns.Msg
	if err := q.Unpack(query); err != nil || q.Response {
		return nil, v
	}
	resp := new(dns.Msg)
	resp.SetReply(&q)
	resp.RecursionAvailable = true
	if q.Opcode != dns.OpcodeQuery || len(q.Question) != 1 {
		resp.Rcode = dns.RcodeNotImplemented
		v.Reason = "not a single-question query"
		return pack(resp), v
	}
	qq := q.Question[0]
	v.Type = dns.TypeToString[qq.Qtype]
	v.Name = netrule.NormalizeName(qq.Name)
	if qq.Qclass != dns.ClassINET || v.Name == "" {
		resp.Rcode = dns.RcodeRefused
		v.Reason = "not an Internet-class query for a DNS name"
		return pack(resp), v
	}
	if v.Name == agentproto.ReadinessName {
		resp.Rcode = dns.RcodeNameError
		v.Probe, v.Reason = true, "the agent's readiness probe"
		return pack(resp), v
	}
	rule, ok := d.Rules.AllowsName(v.Name, 0)
	if !ok {
		resp.Rcode = dns.RcodeNameError
		v.Reason = "name not on the allowlist"
		return pack(resp), v
	}
	v.Allowed, v.Rule = true, rule.Text
	if qq.Qtype != dns.TypeA && qq.Qtype != dns.TypeAAAA {
		// Allowed name, other record type (MX, TXT, …): empty answer.
		v.Reason = "record type not served"
		return pack(resp), v
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs, err := d.Resolve(ctx, v.Name)
	if err != nil {
		resp.Rcode = dns.RcodeServerFailure
		v.Reason = "lookup failed: " + err.Error()
		return pack(resp), v
	}
	ttl := d.TTL
	if ttl == 0 {
		ttl = 30
	}
	for _, a := range addrs {
		a = a.Unmap()
		if c := Classify(a); c != "" && !d.allowedRange(a) {
			v.Refused = append(v.Refused, a)
			continue
		}
		hdr := dns.RR_Header{Name: qq.Name, Class: dns.ClassINET, Ttl: ttl}
		switch {
		case a.Is4() && qq.Qtype == dns.TypeA:
			hdr.Rrtype = dns.TypeA
			resp.Answer = append(resp.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
			v.Addrs = append(v.Addrs, a)
		case a.Is6() && qq.Qtype == dns.TypeAAAA:
			hdr.Rrtype = dns.TypeAAAA
			resp.Answer = append(resp.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			v.Addrs = append(v.Addrs, a)
		}
	}
	if len(v.Addrs) == 0 && len(v.Refused) > 0 {
		resp.Rcode = dns.RcodeRefused
		v.Reason = "every address is in a refused range (" + Classify(v.Refused[0]) + ")"
	}
	return pack(resp), v
}

func (d *DNS) allowedRange(a netip.Addr) bool {
	for _, p := range d.Allowed {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func pack(m *dns.Msg) []byte {
	b, err := m.Pack()
	if err != nil {
		return nil
	}
	return b
}
