package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Comparison of exec reports (vmgated bench compare): the runs of a
// baseline build against the runs of the build under test, taken in turns
// on one host (contrib/bench-baseline.sh), figure by figure. A report is
// read as JSON, not as ExecReport, so that a baseline of an older build,
// with fewer or other figures, compares on the figures both have.

// CompareRow is one figure of a comparison: its name, the median over
// each side's runs, the change from base to new in percent (positive is
// worse, whichever way the figure points), and whether that change is
// past the threshold.
type CompareRow struct {
	Figure    string  `json:"figure"`
	Base      float64 `json:"base"`
	New       float64 `json:"new"`
	WorsePct  float64 `json:"worse_pct"`
	Regressed bool    `json:"regressed"`
}

// Figures reads one report's comparable figures: each latency's p50
// ("restore_ms", "oneshot_pool_parts_ms.vm"), the throughput per
// concurrency ("throughput_c2_per_minute"), and the report's scalar
// memory and disk figures. Counts, spreads, the machine and the levers
// are not figures to compare.
func Figures(report []byte) (map[string]float64, error) {
	var top map[string]any
	if err := json.Unmarshal(report, &top); err != nil {
		return nil, fmt.Errorf("a report: %w", err)
	}
	out := map[string]float64{}
	for k, v := range top {
		switch k {
		case "machine", "when", "levers", "ratios", "notes", "template_built":
			continue
		case "throughput":
			l, _ := v.([]any)
			for _, e := range l {
				m, _ := e.(map[string]any)
				c, okC := m["concurrency"].(float64)
				pm, okP := m["per_minute"].(float64)
				if okC && okP {
					out["throughput_c"+strconv.Itoa(int(c))+"_per_minute"] = pm
				}
			}
			continue
		}
		addFigures(out, k, v)
	}
	return out, nil
}

// addFigures adds what v holds under name: a number itself, a Stat's p50,
// a Memory's PSS, or, for a map of Stats, each one's p50 under
// name.key. Zeros are left out: they are figures of parts not measured.
func addFigures(out map[string]float64, name string, v any) {
	switch x := v.(type) {
	case float64:
		if x != 0 { // a scalar of a part not measured
			out[name] = x
		}
	case map[string]any:
		if p, ok := x["p50"].(float64); ok {
			if n, _ := x["n"].(float64); n > 0 {
				out[name] = p
			}
			return
		}
		if p, ok := x["pss_mib"].(float64); ok {
			if p > 0 {
				out[name+".pss_mib"] = p
			}
			return
		}
		for k, e := range x {
			if m, ok := e.(map[string]any); ok {
				if p, ok := m["p50"].(float64); ok {
					if n, _ := m["n"].(float64); n > 0 {
						out[name+"."+k] = p
					}
				}
			}
		}
	}
}

// higherIsBetter: throughputs; every other figure is a time or a size.
func higherIsBetter(figure string) bool { return strings.HasSuffix(figure, "_per_minute") }

// Compare compares the runs of base with the runs of new (each a report's
// Figures) on the figures both sides have: each side's median, and the
// change past thresholdPct flagged. Rows are sorted by name.
func Compare(base, new []map[string]float64, thresholdPct float64) []CompareRow {
	names := map[string]bool{}
	for _, r := range base {
		for k := range r {
			names[k] = true
		}
	}
	var rows []CompareRow
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range names {
			if !yield(k) {
				return
			}
		}
	}) {
		b, okB := median(base, k)
		n, okN := median(new, k)
		if !okB || !okN {
			continue
		}
		row := CompareRow{Figure: k, Base: b, New: n}
		if b != 0 {
			row.WorsePct = (n - b) / math.Abs(b) * 100
			if higherIsBetter(k) {
				row.WorsePct = -row.WorsePct
			}
			row.WorsePct = math.Round(row.WorsePct*10) / 10
			row.Regressed = row.WorsePct > thresholdPct
		}
		rows = append(rows, row)
	}
	return rows
}

// median of figure k over the runs that have it.
func median(runs []map[string]float64, k string) (float64, bool) {
	var v []float64
	for _, r := range runs {
		if x, ok := r[k]; ok {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return 0, false
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2], true
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2, true
}

// WriteComparison prints rows as a table: the figure, both medians, the
// change, and "WORSE" where it is past the threshold.
func WriteComparison(w io.Writer, rows []CompareRow, baseRuns, newRuns int) {
	fmt.Fprintf(w, "%-44s %12s %12s %8s\n", "figure (median)", fmt.Sprintf("base (%d)", baseRuns), fmt.Sprintf("new (%d)", newRuns), "worse")
	for _, r := range rows {
		flag := ""
		if r.Regressed {
			flag = "  WORSE"
		}
		fmt.Fprintf(w, "%-44s %12.1f %12.1f %7.1f%%%s\n", r.Figure, r.Base, r.New, r.WorsePct, flag)
	}
}
