package bench

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestFigures: a report's figures are its p50s, throughputs and memory;
// an empty Stat (a part not measured) is no figure; an older report with
// fewer fields reads as far as it goes.
func TestFigures(t *testing.T) {
	rep := ExecReport{
		Machine: Machine{CPUs: 2}, When: time.Unix(1, 0),
		RestoreMS:            Stat{N: 10, P50: 200, P95: 300},
		RestoreAheadPhasesMS: map[string]Stat{"qemu": {N: 10, P50: 40}, "none": {}},
		Throughput:           []Throughput{{Concurrency: 1, PerMinute: 180}, {Concurrency: 4, PerMinute: 170}},
		ForkIdle:             Memory{VMs: 8, PSSMiB: 47},
		ForkIdlePSS:          47.5,
		Levers:               map[string]any{"x": 1.0},
		Ratios:               map[string]float64{"r": 2},
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Figures(b)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		"restore_ms": 200, "restore_ahead_phases_ms.qemu": 40,
		"throughput_c1_per_minute": 180, "throughput_c4_per_minute": 170,
		"fork_idle.pss_mib": 47, "fork_idle_pss_mib": 47.5,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("figures:\n got %v\nwant %v", got, want)
	}
	old, err := Figures([]byte(`{"restore_ms":{"n":3,"p50":150},"throughput":[{"concurrency":2,"per_minute":200}],"unknown":{"a":"b"}}`))
	if err != nil || len(old) != 2 || old["restore_ms"] != 150 || old["throughput_c2_per_minute"] != 200 {
		t.Errorf("an older report: %v %v", old, err)
	}
	if _, err := Figures([]byte("{")); err == nil {
		t.Error("a broken report read")
	}
}

// TestCompare: medians per side, the change signed so that positive is
// worse for times and for throughputs alike, the threshold, and figures
// one side lacks left out.
func TestCompare(t *testing.T) {
	base := []map[string]float64{
		{"restore_ms": 100, "throughput_c1_per_minute": 180, "only_base": 1},
		{"restore_ms": 120, "throughput_c1_per_minute": 200},
		{"restore_ms": 110, "throughput_c1_per_minute": 190},
	}
	cur := []map[string]float64{
		{"restore_ms": 130, "throughput_c1_per_minute": 120},
		{"restore_ms": 140, "throughput_c1_per_minute": 130, "only_new": 1},
	}
	rows := Compare(base, cur, 20)
	want := []CompareRow{
		{Figure: "restore_ms", Base: 110, New: 135, WorsePct: 22.7, Regressed: true},
		{Figure: "throughput_c1_per_minute", Base: 190, New: 125, WorsePct: 34.2, Regressed: true},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("rows:\n got %+v\nwant %+v", rows, want)
	}
	better := Compare(cur, base, 20)
	for _, r := range better {
		if r.Regressed || r.WorsePct >= 0 {
			t.Errorf("an improvement flagged: %+v", r)
		}
	}
	var sb strings.Builder
	WriteComparison(&sb, rows, 3, 2)
	if out := sb.String(); !strings.Contains(out, "base (3)") || strings.Count(out, "WORSE") != 2 {
		t.Errorf("table:\n%s", out)
	}
}
