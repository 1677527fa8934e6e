package gateway

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm/netstack"
)

// netBase is the plumbing of every VM network (the daemon's resolver and
// log) with no policy: it allows nothing until SetPolicy.
func (s *Server) netBase() netstack.Config {
	return netstack.Config{Hosts: s.cfg.NetHosts, Log: s.log}
}

// netAudit returns the audit hook of a VM's network: one KindNet record
// per DNS query and connection, tied to the request and the VM.
func (s *Server) netAudit(st *execState, vmID string) func(netstack.Record) {
	return func(r netstack.Record) {
		rec := audit.Record{Kind: audit.KindNet, RequestID: st.reqID, Profile: st.verdict.Profile,
			VMID: vmID, Verdict: audit.VerdictDeny, Rule: r.Rule, Reason: r.Reason,
			Net: &audit.NetEvent{Proto: r.Proto, Name: r.Name, Port: r.Port, BytesOut: r.BytesOut, BytesIn: r.BytesIn, DurationMS: r.Duration.Milliseconds()}}
		setCaller(&rec, st.id)
		if r.Allowed {
			rec.Verdict = audit.VerdictAllow
		}
		s.metrics.netConn(string(rec.Verdict))
		if r.Addr.IsValid() {
			rec.Net.Addr = r.Addr.String()
		}
		// Only allowed connections are recorded one by one: refused
		// events and DNS answers (allowed or not) are what a guest can
		// make at will, so they pass the per-VM flood gate.
		var err error
		if r.Allowed && r.Proto == "tcp" {
			err = s.audit.Write(rec)
		} else {
			err = s.auditGated(s.netGate, vmID, rec)
		}
		if err != nil {
			s.log.Error("audit network event", "err", err)
		}
	}
}

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
