package netstack

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/vmgate/vmgate/policy/netrule"

	"github.com/miekg/dns"
)

func testDNS(t testing.TB) *DNS {
	rs, err := netrule.ParseRules([]string{"allowed.test:80", "*.allowed.test:443", "private.test:80", "broken.test:80"})
	if err != nil {
		t.Fatal(err)
	}
	table := map[string][]string{
		"allowed.test":     {"198.51.100.10", "2001:db8::10"},
		"www.allowed.test": {"198.51.100.11"},
		"private.test":     {"10.0.0.5", "127.0.0.1"},
		"denied.test":      {"198.51.100.12"},
	}
	return &DNS{Rules: rs, Resolve: func(_ context.Context, name string) ([]netip.Addr, error) {
		if name == "broken.test" {
			return nil, errors.New("upstream down")
		}
		var out []netip.Addr
		for _, s := range table[name] {
			out = append(out, netip.MustParseAddr(s))
		}
		return out, nil
	}}
}

func mustRules(t testing.TB, specs ...string) netrule.Rules {
	rs, err := netrule.ParseRules(specs)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func query(t testing.TB, name string, qtype uint16) []byte {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDNS(t *testing.T) {
	d := testDNS(t)
	cases := []struct {
		name    string
		qtype   uint16
		rcode   int
		answers int
		allowed bool
	}{
		{"allowed.test.", dns.TypeA, dns.RcodeSuccess, 1, true},
		{"Allowed.TEST.", dns.TypeAAAA, dns.RcodeSuccess, 1, true},
		{"www.allowed.test.", dns.TypeA, dns.RcodeSuccess, 1, true},
		{"denied.test.", dns.TypeA, dns.RcodeNameError, 0, false},
		{"private.test.", dns.TypeA, dns.RcodeRefused, 0, true},
		{"broken.test.", dns.TypeA, dns.RcodeServerFailure, 0, true},
		{"allowed.test.", dns.TypeMX, dns.RcodeSuccess, 0, true},
	}
	for _, c := range cases {
		out, v := d.Handle(context.Background(), query(t, c.name, c.qtype))
		var r dns.Msg
		if err := r.Unpack(out); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.Rcode != c.rcode || len(r.Answer) != c.answers || v.Allowed != c.allowed || !r.Response {
			t.Errorf("%s %s: rcode %d answers %d verdict %+v", c.name, dns.TypeToString[c.qtype], r.Rcode, len(r.Answer), v)
		}
	}
	// The agent's readiness probe is answered here, even when a rule
	// would allow the name, and marked so that it is not audited.
	d.Rules = append(d.Rules, mustRules(t, "*.vmgate.invalid:80")...)
	out, v := d.Handle(context.Background(), query(t, "Ready.VMGate.invalid.", dns.TypeA))
	var pr dns.Msg
	if err := pr.Unpack(out); err != nil || pr.Rcode != dns.RcodeNameError || !v.Probe || v.Allowed {
		t.Errorf("readiness probe: %v rcode %d verdict %+v", err, pr.Rcode, v)
	}
	if _, v := d.Handle(context.Background(), query(t, "allowed.test.", dns.TypeA)); v.Probe {
		t.Error("an ordinary query is marked as the probe")
	}
	// The operator may allow a private range explicitly.
	d.Allowed = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	out, v = d.Handle(context.Background(), query(t, "private.test.", dns.TypeA))
	var r dns.Msg
	if err := r.Unpack(out); err != nil || len(r.Answer) != 1 || len(v.Refused) != 1 {
		t.Fatalf("allowed range: %v %+v %+v", err, r, v)
	}
	// Garbage and responses get no answer.
	if out, _ := d.Handle(context.Background(), []byte("garbage")); out != nil {
		t.Error("answered garbage")
	}
	resp := new(dns.Msg)
	resp.SetQuestion("allowed.test.", dns.TypeA)
	resp.Response = true
	b, _ := resp.Pack()
	if out, _ := d.Handle(context.Background(), b); out != nil {
		t.Error("answered a response")
	}
}

func FuzzDNSHandle(f *testing.F) {
	f.Add(query(f, "allowed.test.", dns.TypeA))
	f.Add(query(f, "x.", dns.TypeTXT))
	d := testDNS(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		out, v := d.Handle(context.Background(), b)
		if out == nil {
			return
		}
		var r dns.Msg
		if err := r.Unpack(out); err != nil {
			t.Fatalf("unparseable answer: %v", err)
		}
		for _, a := range v.Addrs {
			if Classify(a) != "" {
				t.Fatalf("answered a special address %s", a)
			}
		}
	})
}
