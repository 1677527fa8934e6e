package netproc

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm/netstack"
)

func TestParseRecord(t *testing.T) {
	good := `{"gen":3,"record":{"proto":"tcp","name":"example.com","addr":"93.184.215.14","port":443,"allowed":true,"rule":"example.com:443","bytes_out":10,"bytes_in":20,"duration_ns":1000000}}`
	m, err := parseMessage([]byte(good))
	want := netstack.Record{Proto: "tcp", Name: "example.com", Addr: netip.MustParseAddr("93.184.215.14"), Port: 443, Allowed: true,
		Rule: "example.com:443", BytesOut: 10, BytesIn: 20, Duration: time.Millisecond}
	if err != nil || m.gen != 3 || m.record != want || m.end != "" {
		t.Fatalf("parseMessage(good) = %+v, %v", m, err)
	}
	if m, err := parseMessage([]byte(`{"gen":4,"end":"qemu"}`)); err != nil || m.end != endQEMU || m.gen != 4 {
		t.Fatalf("parseMessage(end) = %+v, %v", m, err)
	}
	if m, err := parseMessage([]byte(`{"gen":5,"applied":true}`)); err != nil || !m.applied || m.gen != 5 || m.end != "" {
		t.Fatalf("parseMessage(applied) = %+v, %v", m, err)
	}
	for name, bad := range map[string]string{
		"unknown field":  `{"gen":1,"record":{"proto":"tcp"},"extra":1}`,
		"unknown proto":  `{"gen":1,"record":{"proto":"icmp"}}`,
		"negative bytes": `{"gen":1,"record":{"proto":"tcp","bytes_in":-1}}`,
		"two objects":    `{"gen":1,"record":{"proto":"tcp"}}{}`,
		"bad address":    `{"gen":1,"record":{"proto":"tcp","addr":"nowhere"}}`,
		"not JSON":       "\x00\x01",
		"too long":       `{"gen":1,"record":{"proto":"tcp","name":"` + strings.Repeat("a", MaxMessage) + `"}}`,
		"no record":      `{"gen":1}`,
		"null record":    `{"gen":1,"record":null}`,
		"unknown end":    `{"gen":1,"end":"later"}`,
		"record and end": `{"gen":1,"record":{"proto":"tcp"},"end":"qemu"}`,
		"applied record": `{"gen":1,"record":{"proto":"tcp"},"applied":true}`,
		"applied end":    `{"gen":1,"applied":true,"end":"qemu"}`,
		"applied false":  `{"gen":1,"applied":false}`,
	} {
		if _, err := parseMessage([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestEgressWire: a policy crosses the channel unchanged.
func TestEgressWire(t *testing.T) {
	rules, err := netrule.ParseRules([]string{"*.example.com:443", "203.0.113.0/24:80"})
	if err != nil {
		t.Fatal(err)
	}
	e := netrule.Egress{Rules: rules, AllowedRanges: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, MaxConns: 3, MaxBytes: 4, ConnectRate: 5}
	sec := netstack.Secret{Hosts: rules[:1]}
	sec.Name, sec.Placeholder, sec.Value, sec.Headers, sec.Query = "TOKEN", "vmgate_secret_0123456789abcdef", "v", []string{"Authorization"}, true
	ca, err := netstack.NewSessionCA("s")
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(toChild{Gen: 1, Policy: egressToWire(netstack.Policy{Egress: e, Secrets: []netstack.Secret{sec}, CA: ca})})
	if err != nil {
		t.Fatal(err)
	}
	var m toChild
	if err := decodeStrict(b, &m); err != nil {
		t.Fatal(err)
	}
	got, err := m.Policy.egress()
	if err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(e)
	if string(gb) != string(wb) {
		t.Fatalf("egress after the channel:\n%s\nwant\n%s", gb, wb)
	}
	secrets, err := m.Policy.secrets()
	if err != nil {
		t.Fatal(err)
	}
	if len(secrets) != 1 || !reflect.DeepEqual(secrets[0].Secret, sec.Secret) || secrets[0].Hosts[0].Text != "*.example.com:443" || string(m.Policy.CA.Key) != string(ca.KeyPEM) {
		t.Fatalf("secrets after the channel: %+v", secrets)
	}
	m.Policy.Secrets[0].Placeholder = "short"
	if _, err := m.Policy.secrets(); err == nil {
		t.Fatal("a secret without a real placeholder was accepted")
	}
}

// TestAttribute: records reach the audit of the policy they name; a
// record of an unknown policy, or more allowed connections than the
// policy permits, is the netstack misbehaving.
func TestAttribute(t *testing.T) {
	var got []uint64
	p := &Proc{audits: map[uint64]func(netstack.Record){
		1: func(netstack.Record) { got = append(got, 1) },
		2: func(netstack.Record) { got = append(got, 2) },
	}, limit: newAllowLimit(netrule.Egress{ConnectRate: 10, MaxConns: 2})}
	if err := p.attribute(1, netstack.Record{Proto: "dns"}); err != nil {
		t.Fatal(err)
	}
	if err := p.attribute(2, netstack.Record{Proto: "tcp"}); err != nil {
		t.Fatal(err)
	}
	if err := p.attribute(7, netstack.Record{Proto: "tcp"}); err == nil {
		t.Error("a record of a policy never sent was accepted")
	}
	if len(got) != 2 || got[0] != 1 || got[1] != 2 {
		t.Fatalf("audits called %v", got)
	}
	// Burst: 2*10/5 + 2 = 6 allowed connections at once, then refused.
	var err error
	n := 0
	for ; n < 100 && err == nil; n++ {
		err = p.attribute(2, netstack.Record{Proto: "tcp", Allowed: true})
	}
	if err == nil || n != 7 {
		t.Fatalf("allowed connections: error %v after %d", err, n)
	}
	// Refused events and DNS answers are not bounded here (the daemon's
	// flood gate is).
	for range 100 {
		if err := p.attribute(2, netstack.Record{Proto: "tcp"}); err != nil {
			t.Fatal(err)
		}
	}
}

func FuzzParseMessage(f *testing.F) {
	f.Add([]byte(`{"gen":3,"record":{"proto":"tcp","name":"example.com","addr":"93.184.215.14","port":443,"allowed":true}}`))
	f.Add([]byte(`{"gen":1,"record":{"proto":"dns","addr":"::1"}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"gen":2,"end":"qemu"}`))
	f.Add([]byte(`{"gen":2,"applied":true}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := parseMessage(b)
		if err != nil {
			return
		}
		if m.applied {
			if m.end != "" || m.record != (netstack.Record{}) {
				t.Fatalf("accepted applied %+v", m)
			}
			return
		}
		if m.end != "" {
			if m.end != endQEMU || m.record != (netstack.Record{}) {
				t.Fatalf("accepted end %+v", m)
			}
			return
		}
		r := m.record
		if r.BytesIn < 0 || r.BytesOut < 0 || r.Duration < 0 || (r.Proto != "tcp" && r.Proto != "udp" && r.Proto != "dns") {
			t.Fatalf("accepted %+v", r)
		}
	})
}
