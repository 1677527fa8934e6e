package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

// TestReceiptBody: what a receipt says of an allowed command that ran, a
// denial, and a request whose VM never came, from the request's state,
// its outcome and the audit log's facts.
func TestReceiptBody(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.FixedZone("x", 3600))
	now := t0.Add(2 * time.Second)
	rules, _ := netrule.ParseRules([]string{"example.com:443"})
	allowed := policy.Verdict{Allowed: true, Profile: "agent", Rule: "allow[0] any", Reason: "allowed", Image: "default",
		Network: &policy.NetworkPolicy{Rules: rules}}
	denied := policy.Verdict{Profile: "agent", Rule: "deny[1] no-rm", Reason: `argument "-rf" is denied`}
	id := policy.Identity{UID: 1000, GID: 100, PID: 42, User: "alice"}
	req := &wire.ExecRequest{Argv: []string{"echo hi"}, Shell: true, Env: []string{"LANG=C", "TOKEN=secret"}, Dir: "/tmp", Session: "s1"}
	entry := &audit.Entry{Seq: 9, Hash: "h9"}
	facts := receiptFacts{policySource: "p.toml", policyDigest: "pd", imageDigest: "id", record: entry, headSeq: 11, head: "h11", now: now}
	done := execOutcome{res: &vm.ExecResult{ExitCode: 2, StdoutTruncated: true}, stdin: receipt.StreamOf([]byte("in")),
		stdout: receipt.StreamOf([]byte("out")), transfers: []wire.Transfer{{Direction: "put", Guest: "/x", Files: 1, Bytes: 3, SHA256: "t"}}}

	cases := []struct {
		name    string
		verdict policy.Verdict
		o       execOutcome
		facts   receiptFacts
		check   func(t *testing.T, b receipt.Body)
	}{
		{"allowed and ran", allowed, done, facts, func(t *testing.T, b receipt.Body) {
			if b.Verdict != receipt.VerdictAllow || b.Reason != "" || b.Profile != "agent" || b.Rule != "allow[0] any" {
				t.Errorf("verdict %q %q %q %q", b.Verdict, b.Reason, b.Profile, b.Rule)
			}
			if b.ExitCode == nil || *b.ExitCode != 2 || !b.OutputTruncated || b.Error != "" {
				t.Errorf("outcome %v %v %q", b.ExitCode, b.OutputTruncated, b.Error)
			}
			if b.Image == nil || *b.Image != (receipt.Image{Name: "default", SHA256: "id"}) || b.Policy != (receipt.Policy{Source: "p.toml", SHA256: "pd"}) {
				t.Errorf("image %+v policy %+v", b.Image, b.Policy)
			}
			if b.Stdin != receipt.StreamOf([]byte("in")) || b.Stdout != receipt.StreamOf([]byte("out")) || b.Stderr != receipt.StreamOf(nil) {
				t.Errorf("streams %+v %+v %+v", b.Stdin, b.Stdout, b.Stderr)
			}
			if len(b.Transfers) != 1 || b.Transfers[0].SHA256 != "t" {
				t.Errorf("transfers %+v", b.Transfers)
			}
			if b.Network.Mode != "allowlist" || fmt.Sprint(b.Network.Allow) != "[example.com:443]" {
				t.Errorf("network %+v", b.Network)
			}
			if *b.Audit != (receipt.AuditRef{Seq: 9, Hash: "h9", HeadSeq: 11, Head: "h11"}) {
				t.Errorf("audit %+v", b.Audit)
			}
		}},
		{"an imported image", policy.Verdict{Allowed: true, Profile: "agent", Rule: "default", Reason: "allowed", Image: "py"}, done,
			receiptFacts{imageDigest: "id", imageManifest: "sha256:ab", record: entry, headSeq: 11, head: "h11", now: now}, func(t *testing.T, b receipt.Body) {
				if b.Image == nil || *b.Image != (receipt.Image{Name: "py", SHA256: "id", ManifestDigest: "sha256:ab"}) {
					t.Errorf("image %+v", b.Image)
				}
			}},
		{"narrowed to nothing", policy.Verdict{Allowed: true, Profile: "agent", Rule: "default", Reason: "allowed",
			Network: &policy.NetworkPolicy{}, NetNarrowed: []string{policy.NarrowedByRequest, policy.NarrowedByLock}}, done, facts, func(t *testing.T, b receipt.Body) {
			if b.Network.Mode != "allowlist" || len(b.Network.Allow) != 0 || fmt.Sprint(b.Network.Narrowed) != "[request session lock]" {
				t.Errorf("network %+v", b.Network)
			}
		}},
		{"denied", denied, execOutcome{}, receiptFacts{policySource: "p.toml", policyDigest: "pd", record: entry, headSeq: 9, head: "h9", now: now}, func(t *testing.T, b receipt.Body) {
			if b.Verdict != receipt.VerdictDeny || b.Reason != denied.Reason || b.Rule != denied.Rule || b.Image != nil || b.ExitCode != nil {
				t.Errorf("denial: %+v", b)
			}
			if b.Stdout != receipt.StreamOf(nil) || b.Network.Mode != "none" || b.Audit.Seq != 9 {
				t.Errorf("denial streams, network, audit: %+v %+v %+v", b.Stdout, b.Network, b.Audit)
			}
		}},
		{"denial held back by the flood gate", denied, execOutcome{}, receiptFacts{auditNote: "held back", now: now}, func(t *testing.T, b receipt.Body) {
			if b.Audit != nil || b.AuditNote != "held back" {
				t.Errorf("audit %+v %q", b.Audit, b.AuditNote)
			}
		}},
		{"no VM", allowed, execOutcome{err: errors.New("start vm: no slot")}, facts, func(t *testing.T, b receipt.Body) {
			if b.ExitCode != nil || b.Error != "start vm: no slot" || b.VMID != "" {
				t.Errorf("failure: %v %q %q", b.ExitCode, b.Error, b.VMID)
			}
		}},
		{"head read before the record", allowed, done, receiptFacts{record: entry, headSeq: 8, head: "h8", now: now}, func(t *testing.T, b receipt.Body) {
			if b.Audit.HeadSeq != 9 || b.Audit.Head != "h9" {
				t.Errorf("audit %+v", b.Audit)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st := newExecState(id, req, false)
			st.start, st.verdict = t0, c.verdict
			b := receiptBody(st, c.o, c.facts)
			if b.RequestID != st.reqID || fmt.Sprint(b.Argv) != "[sh -c echo hi]" || !b.Shell || b.Session != "s1" || b.Dir != "/tmp" {
				t.Errorf("request: %+v", b)
			}
			if fmt.Sprint(b.EnvNames) != "[LANG TOKEN]" || strings.Contains(fmt.Sprint(b), "secret") {
				t.Errorf("env: %v", b.EnvNames)
			}
			if *b.Caller.UID != 1000 || *b.Caller.GID != 100 || b.Caller.PID != 42 || b.Caller.User != "alice" {
				t.Errorf("caller %+v", b.Caller)
			}
			if b.Start.Location() != time.UTC || !b.Start.Equal(t0) || !b.End.Equal(now) {
				t.Errorf("times %v %v", b.Start, b.End)
			}
			c.check(t, b)
		})
	}
}

// TestNetSummary: the guest's network events are counted by kind, and
// distinct destinations listed up to the bound, the rest counted.
func TestNetSummary(t *testing.T) {
	var n netSummary
	a := netip.MustParseAddr("93.184.215.14")
	n.add(netstack.Record{Proto: "dns", Name: "example.com", Allowed: true})
	for range 3 {
		n.add(netstack.Record{Proto: "tcp", Name: "example.com", Addr: a, Port: 443, Allowed: true})
	}
	n.add(netstack.Record{Proto: "tcp", Addr: netip.MustParseAddr("10.0.0.1"), Port: 22, Reason: "private range"})
	for i := range receipt.MaxDestinations + 5 {
		n.add(netstack.Record{Proto: "udp", Port: uint16(1000 + i), Reason: "not allowed"})
	}
	s := n.summary(nil)
	if s.Mode != "none" || s.Connections != 3 || s.Refused != 1+receipt.MaxDestinations+5 || s.DNS != 1 {
		t.Fatalf("counts %+v", s)
	}
	if len(s.Destinations) != receipt.MaxDestinations || s.Omitted != 8 { // 3 + 37 distinct, 32 kept
		t.Fatalf("%d destinations, %d omitted", len(s.Destinations), s.Omitted)
	}
	if d := s.Destinations[1]; d.Count != 3 || !d.Allowed || d.Addr != a.String() || d.Reason != "" {
		t.Fatalf("allowed destination %+v", d)
	}
	if d := s.Destinations[2]; d.Allowed || d.Reason != "private range" {
		t.Fatalf("refused destination %+v", d)
	}
	var none *netSummary
	if s := none.summary(nil); s.Mode != "none" {
		t.Fatal(s)
	}
}

// TestEgressOneSpelling: the audit log's decision record and the receipt
// describe a verdict's egress the same way, allowed ranges included.
func TestEgressOneSpelling(t *testing.T) {
	rules, _ := netrule.ParseRules([]string{"example.com:443", "10.1.0.0/16:5432"})
	v := policy.Verdict{Allowed: true, Network: &policy.NetworkPolicy{Rules: rules, AllowedRanges: []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")}}}
	rec, rcpt := auditNetwork(v).Allow, (*netSummary)(nil).summary(v.Network).Allow
	want := []string{"example.com:443", "10.1.0.0/16:5432", "100.64.0.0/10 (allowed range)"}
	if fmt.Sprint(rec) != fmt.Sprint(want) || fmt.Sprint(rcpt) != fmt.Sprint(want) {
		t.Errorf("audit record %q, receipt %q; want both %q", rec, rcpt, want)
	}
}
