package gateway

import (
	"github.com/vmgate/vmgate/gateway/audit"
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
		st.net.add(r)
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
			_, err = s.auditGated(s.netGate, vmID, rec)
		}
		if err != nil {
			s.log.Error("audit network event", "err", err)
		}
	}
}
