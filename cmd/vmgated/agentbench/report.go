package agentbench

import (
	"bytes"
	"fmt"
	"html"
	"html/template"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// WriteReport writes report.html (self-contained: inline CSS and SVG,
// no scripts, no external assets; traces linked relatively) and
// report.md into dir.
func WriteReport(dir string, s *Summary, results []TrialResult) error {
	var md bytes.Buffer
	WriteMarkdown(&md, s, results)
	if err := os.WriteFile(filepath.Join(dir, "report.md"), md.Bytes(), 0o644); err != nil {
		return err
	}
	var b bytes.Buffer
	if err := reportTmpl.Execute(&b, reportData{S: s, Results: results,
		PassChart: template.HTML(passChart(s)), TTFChart: template.HTML(ttfChart(results)), TurnsChart: template.HTML(turnsChart(results))}); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.html"), b.Bytes(), 0o644)
}

type reportData struct {
	S                               *Summary
	Results                         []TrialResult
	PassChart, TTFChart, TurnsChart template.HTML
}

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"pct":   pct,
	"secs":  secs,
	"turns": turnsText,
	"modes": modesText,
	"yesno": yesNo,
	"failed": func(cs []CheckResult) string {
		var f []string
		for _, c := range cs {
			if !c.OK {
				s := c.Phase + ": " + c.Name
				if c.Detail != "" {
					s += " (" + c.Detail + ")"
				}
				f = append(f, s)
			}
		}
		return strings.Join(f, "; ")
	},
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>vmgate agent benchmark: {{.S.Agent}}{{with .S.Model}} · {{.}}{{end}}</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.15em;margin-top:2em}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}.ok{color:#176b2c;font-weight:600}.bad{color:#a31515;font-weight:600}
.big{font-size:1.3em}svg{max-width:100%;height:auto;background:#fff}.muted{color:#666}
</style></head><body>
<h1>vmgate agent benchmark</h1>
<p class="big">Agent <b>{{.S.Agent}}</b>{{with .S.Model}}, model <b>{{.}}</b>{{end}}{{with .S.Endpoint}} at <code>{{.}}</code>{{end}}:
<b>{{.S.Resolved}} of {{.S.Trials}}</b> trials resolved, <b>{{pct .S.PassRate}}</b> (95 % CI {{pct .S.CI95.Lo}}–{{pct .S.CI95.Hi}}),
pass@{{.S.K}} {{pct .S.PassAtK}}, median time-to-fix {{secs .S.MedianTTF}}.</p>
{{if .S.Harness}}<p class="bad">{{.S.Harness}} harness errors: those trials say nothing about the agent.</p>{{end}}
<p class="muted">{{len .S.Scenarios}} scenarios × {{.S.K}} runs; {{.S.Tokens}} tokens{{if not .S.Started.IsZero}}; started {{.S.Started.UTC.Format "2006-01-02 15:04 UTC"}}, {{.S.Seconds}} s{{end}}.
Time-to-fix is the agent's wall time in resolved trials; intervals are 95 % Wilson score intervals.</p>
<h2>Pass rate per scenario</h2>
{{.PassChart}}
<h2>Time to fix (resolved trials)</h2>
{{.TTFChart}}
<h2>Turns used</h2>
{{.TurnsChart}}
<h2>Scenarios</h2>
<table><tr><th>scenario</th><th>category</th><th>difficulty</th><th>resolved</th><th>pass rate</th><th>95 % CI</th><th>pass@{{.S.K}}</th><th>median time-to-fix</th><th>median turns</th><th>failures</th></tr>
{{range .S.Scenarios}}<tr><td title="{{.Title}}">{{.ID}}</td><td>{{.Category}}</td><td>{{.Difficulty}}</td><td>{{.Resolved}}/{{.Trials}}</td><td>{{pct .PassRate}}</td><td>{{pct .CI95.Lo}}–{{pct .CI95.Hi}}</td><td>{{pct .PassAtK}}</td><td>{{secs .MedianTTF}}</td><td>{{turns .MedianTurns}}</td><td>{{modes .FailureModes}}</td></tr>
{{end}}</table>
<h2>Trials</h2>
<table><tr><th>scenario</th><th>run</th><th>resolved</th><th>failure mode</th><th>stopped</th><th>turns</th><th>tool calls</th><th>invalid</th><th>as text</th><th>tokens</th><th>agent time</th><th>failed checks</th><th>trace</th><th>receipts</th></tr>
{{range .Results}}<tr><td>{{.Scenario}}</td><td>{{.Run}}</td><td class="{{if .Resolved}}ok{{else}}bad{{end}}">{{yesno .Resolved}}</td><td>{{.FailureMode}}{{with .Error}}<br><span class="muted">{{.}}</span>{{end}}</td><td>{{.Stop}}</td><td>{{.Turns}}</td><td>{{.ToolCalls}}</td><td>{{.InvalidToolCalls}}</td><td>{{.TextToolCalls}}</td><td>{{.PromptTokens}}+{{.CompletionTokens}}</td><td>{{printf "%.1f" .AgentSeconds}} s</td><td>{{failed .Checks}}</td><td><a href="{{.Trace}}">{{.Trace}}</a></td><td>{{if .Receipts}}<a href="{{.Receipts}}/">{{.ReceiptCount}}</a>{{with .ReceiptErrors}} <span class="bad">({{len .}} refused)</span>{{end}}{{else}}–{{end}}</td></tr>
{{end}}</table>
<p class="muted">Each trial's commands have signed receipts in its receipts directory; <code>vmgated receipt verify DIR --key DIR/receipt.pub --audit DIR/audit.jsonl</code> checks them against the daemon's key and audit log.</p>
</body></html>
`))

const chartW = 900

// passChart draws a horizontal bar per scenario with its interval.
func passChart(s *Summary) string {
	const rowH, left, right, top = 22, 230, 60, 24
	h := top + rowH*len(s.Scenarios) + 30
	plotW := chartW - left - right
	x := func(p float64) float64 { return left + p*float64(plotW) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg viewBox="0 0 %d %d" width="%d" role="img" aria-label="pass rate per scenario">`, chartW, h, chartW)
	for _, t := range []float64{0, .25, .5, .75, 1} {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/><text x="%.1f" y="%d" font-size="11" text-anchor="middle" fill="#666">%.0f %%</text>`,
			x(t), top-4, x(t), h-24, x(t), h-10, t*100)
	}
	for i, ss := range s.Scenarios {
		y := top + i*rowH
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="12" text-anchor="end">%s</text>`, left-8, y+14, html.EscapeString(ss.ID))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="14" fill="#4a7fc1"><title>%s: %d/%d</title></rect>`,
			left, y+3, x(ss.PassRate)-left, html.EscapeString(ss.ID), ss.Resolved, ss.Trials)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222" stroke-width="1.5"/>`, x(ss.CI95.Lo), y+10, x(ss.CI95.Hi), y+10)
		for _, e := range []float64{ss.CI95.Lo, ss.CI95.Hi} {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222" stroke-width="1.5"/>`, x(e), y+5, x(e), y+15)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" fill="#333">%d/%d</text>`, chartW-right+8, y+14, ss.Resolved, ss.Trials)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// histogram draws counts of values in bins, two series stacked.
func histogram(label string, edges []float64, a, c []int, aName, cName, unit string) string {
	const h, left, bottom, top = 220, 50, 40, 16
	n := len(a)
	maxC := 1
	for i := range n {
		maxC = max(maxC, a[i]+c[i])
	}
	plotW := float64(chartW - left - 20)
	bw := plotW / float64(n)
	y := func(v int) float64 { return float64(h-bottom) - float64(v)/float64(maxC)*float64(h-bottom-top) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg viewBox="0 0 %d %d" width="%d" role="img" aria-label="%s">`, chartW, h, chartW, html.EscapeString(label))
	for t := 0; t <= maxC; t += max(1, maxC/5) {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/><text x="%d" y="%.1f" font-size="11" text-anchor="end" fill="#666">%d</text>`,
			left, y(t), chartW-20, y(t), left-6, y(t)+4, t)
	}
	for i := range n {
		x0 := float64(left) + float64(i)*bw
		if a[i] > 0 {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#4a7fc1"><title>%s: %d</title></rect>`, x0+1, y(a[i]), bw-2, y(0)-y(a[i]), aName, a[i])
		}
		if c[i] > 0 {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#d9822b"><title>%s: %d</title></rect>`, x0+1, y(a[i]+c[i]), bw-2, y(a[i])-y(a[i]+c[i]), cName, c[i])
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10" text-anchor="middle" fill="#666">%s</text>`, x0+bw/2, h-bottom+14, fmtEdge(edges[i], edges[i+1], unit))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="#4a7fc1"/><text x="%d" y="%d" font-size="11">%s</text>`, left, h-14, left+14, h-5, aName)
	if cName != "" {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="#d9822b"/><text x="%d" y="%d" font-size="11">%s</text>`, left+140, h-14, left+154, h-5, cName)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func fmtEdge(lo, hi float64, unit string) string {
	if hi-lo == 1 {
		return fmt.Sprintf("%g", lo)
	}
	return fmt.Sprintf("%g–%g%s", lo, hi, unit)
}

// bins returns n+1 round edges covering 0..maxV.
func bins(maxV float64, n int) []float64 {
	step := 1.0
	for step*float64(n) < maxV {
		for _, m := range []float64{2, 2.5, 2} {
			step *= m
			if step*float64(n) >= maxV {
				break
			}
		}
	}
	e := make([]float64, n+1)
	for i := range e {
		e[i] = float64(i) * step
	}
	return e
}

func binOf(v float64, edges []float64) int {
	for i := 1; i < len(edges); i++ {
		if v < edges[i] {
			return i - 1
		}
	}
	return len(edges) - 2
}

func ttfChart(results []TrialResult) string {
	var vals []float64
	for _, r := range results {
		if r.Resolved {
			vals = append(vals, *r.TimeToFix)
		}
	}
	if len(vals) == 0 {
		return `<p class="muted">No trial was resolved.</p>`
	}
	edges := bins(math.Max(1, maxOf(vals)*1.0001), 12)
	a, c := make([]int, 12), make([]int, 12)
	for _, v := range vals {
		a[binOf(v, edges)]++
	}
	return histogram("time to fix", edges, a, c, "resolved trials", "", " s")
}

func turnsChart(results []TrialResult) string {
	if len(results) == 0 {
		return ""
	}
	var vals []float64
	for _, r := range results {
		vals = append(vals, float64(r.Turns))
	}
	n := min(15, int(maxOf(vals))+1)
	edges := bins(maxOf(vals)+1, n)
	a, c := make([]int, n), make([]int, n)
	for _, r := range results {
		i := binOf(float64(r.Turns), edges)
		if r.Resolved {
			a[i]++
		} else {
			c[i]++
		}
	}
	return histogram("turns used", edges, a, c, "resolved", "not resolved", "")
}

func maxOf(xs []float64) float64 {
	m := 0.0
	for _, x := range xs {
		m = math.Max(m, x)
	}
	return m
}
