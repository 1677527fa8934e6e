package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/policy"
)

func TestSummarize(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 20; i++ {
		d = append(d, time.Duration(21-i)*time.Millisecond)
	}
	s := summarize(d)
	if s.N != 20 || s.P50 != 10 || s.P95 != 19 || s.Min != 1 || s.Max != 20 {
		t.Fatalf("%+v", s)
	}
	if s := summarize(nil); s.N != 0 || s.P50 != 0 {
		t.Fatalf("empty: %+v", s)
	}
	if s := summarize([]time.Duration{1500 * time.Microsecond}); s.P50 != 1.5 || s.P95 != 1.5 {
		t.Fatalf("one: %+v", s)
	}
}

func TestWriteText(t *testing.T) {
	r := &ExecReport{
		Machine:         Machine{CPUModel: "cpu", CPUs: 2, MemTotalMiB: 1024, Kernel: "k", QEMU: "q", Accel: "tcg", Cgroups: "none"},
		ColdBootMS:      Stat{N: 1, P50: 20000, P95: 20000},
		RestoreMS:       Stat{N: 3, P50: 400, P95: 450},
		RestorePhasesMS: map[string]Stat{"agent": {P50: 130}, "overlay": {P50: 30}},
		OneshotPoolMS:   Stat{N: 3, P50: 160, P95: 200}, OneshotPoolPartsMS: map[string]Stat{"vm": {P50: 25}, "exec": {P50: 90}, "daemon_total": {P50: 150}},
		Throughput:         []Throughput{{Concurrency: 2, Commands: 4, Seconds: 2, PerMinute: 120, FromPool: 2}},
		IdleRestored:       Memory{VMs: 2, RSSMiB: 140, PSSMiB: 100},
		Ratios:             map[string]float64{"cold_over_restore": 50, "cold_over_oneshot_pool": 125},
		RefusalNoReceiptMS: Stat{N: 30, P50: 1.1}, RefusalReceiptMS: Stat{N: 30, P50: 1.4}, ReceiptOverheadMS: 0.3,
		SessionNoReceiptMS: Stat{N: 30, P50: 35}, SessionReceiptMS: Stat{N: 30, P50: 35.4}, ReceiptOverheadSessionMS: 0.35,
	}
	var b strings.Builder
	r.WriteText(&b)
	out := b.String()
	for _, want := range []string{
		"cold: new overlay + boot + first command", "20000.0", "phases (p50 ms): overlay 30, agent 130",
		"get VM 25, exec 90, whole request 150", "throughput at concurrency 2: 120.0", "PSS 100.0 MiB",
		"cold_over_oneshot_pool x125.0, cold_over_restore x50.0", "accel tcg",
		"session command via daemon, with receipt", "receipt_overhead_ms: 0.30 per request (median of 30 paired differences of refused requests; budget 2 ms); beside a session command: 0.35",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
}

func TestBenchPolicy(t *testing.T) {
	for _, network := range []bool{false, true} {
		p, err := policy.Parse("bench", benchPolicy(6, network))
		if err != nil {
			t.Fatalf("network %v: %v", network, err)
		}
		if sh := p.Shapes(); len(sh) != 1 || sh[0].Network != network {
			t.Errorf("network %v: shapes %+v", network, sh)
		}
		v := p.Decide(policy.Identity{UID: 1000, User: "bench"}, policy.Request{Argv: []string{"true"}})
		if !v.Allowed || v.Limits.MaxVMs != 6 || v.Limits.CallerVMs != 6 || (v.Network != nil) != network {
			t.Errorf("network %v: verdict %+v", network, v)
		}
	}
}

func TestPairedMedian(t *testing.T) {
	ms := func(xs ...float64) []time.Duration {
		var out []time.Duration
		for _, x := range xs {
			out = append(out, time.Duration(x*float64(time.Millisecond)))
		}
		return out
	}
	for _, c := range []struct {
		a, b []time.Duration
		want float64
	}{
		{nil, nil, 0},
		{ms(10), ms(10.5), 0.5},
		{ms(10, 40, 12), ms(11, 39, 15), 1},              // differences 1, -1, 3
		{ms(10, 10, 10, 10), ms(10.2, 9, 11, 10.4), 0.3}, // 0.2, -1, 1, 0.4
		{ms(30, 30), ms(30.5), 0.5},                      // unequal lengths: the pairs there are
	} {
		if got := pairedMedian(c.a, c.b); got != c.want {
			t.Errorf("pairedMedian(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestPartsAndASLR(t *testing.T) {
	if err := CheckParts([]string{"sessions", "cold"}); err != nil {
		t.Error(err)
	}
	if err := CheckParts([]string{"sesions"}); err == nil || !strings.Contains(err.Error(), `"sesions"`) {
		t.Errorf("a misspelt part: %v", err)
	}
	o := ExecOptions{Only: []string{"sessions"}}
	if o.runs("cold") || !o.runs("sessions") || !(&ExecOptions{}).runs("cold") {
		t.Error("runs does not follow Only")
	}
	for _, aslr := range []string{"", "auto", "on"} {
		p, err := policy.Parse("bench", withASLR(sessionPolicy(4), aslr))
		if err != nil {
			t.Fatalf("%q: %v", aslr, err)
		}
		if want := map[string]string{"": "auto"}[aslr]; p.GuestASLR() != aslr && p.GuestASLR() != want {
			t.Errorf("withASLR(%q): policy says %q", aslr, p.GuestASLR())
		}
	}
}
