package agentbench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Interval is a 95 % confidence interval of a proportion.
type Interval struct {
	Lo float64 `json:"lo"`
	Hi float64 `json:"hi"`
}

// Wilson is the 95 % Wilson score interval of k successes in n trials
// (well-behaved at 0 and n, unlike the normal approximation).
func Wilson(k, n int) Interval {
	if n == 0 {
		return Interval{0, 1}
	}
	const z = 1.959963984540054
	p, nf := float64(k)/float64(n), float64(n)
	den := 1 + z*z/nf
	centre := (p + z*z/(2*nf)) / den
	half := z * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf)) / den
	return Interval{Lo: round4(max(0, centre-half)), Hi: round4(min(1, centre+half))}
}

// PassAtK is the unbiased estimate of the chance that at least one of k
// trials drawn from n (c of them successes) succeeds: 1 - C(n-c,k)/C(n,k).
func PassAtK(n, c, k int) float64 {
	if k > n || k < 1 {
		return math.NaN()
	}
	if n-c < k {
		return 1
	}
	prod := 1.0
	for i := n - c + 1; i <= n; i++ {
		prod *= 1 - float64(k)/float64(i)
	}
	return round4(1 - prod)
}

func round4(x float64) float64 { return math.Round(x*1e4) / 1e4 }

func median(xs []float64) *float64 {
	if len(xs) == 0 {
		return nil
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	m = math.Round(m*10) / 10
	return &m
}

// ScenarioSummary is one scenario's row.
type ScenarioSummary struct {
	ID           string         `json:"id"`
	Title        string         `json:"title"`
	Category     string         `json:"category"`
	Difficulty   string         `json:"difficulty"`
	Trials       int            `json:"trials"`
	Resolved     int            `json:"resolved"`
	PassRate     float64        `json:"pass_rate"`
	CI95         Interval       `json:"ci95"`
	PassAtK      float64        `json:"pass_at_k"`
	MedianTTF    *float64       `json:"median_time_to_fix_seconds"`
	MedianTurns  *float64       `json:"median_turns"`
	FailureModes map[string]int `json:"failure_modes,omitempty"`
}

// Summary is a run's result.
type Summary struct {
	Agent    string    `json:"agent"`
	Model    string    `json:"model,omitempty"`
	Endpoint string    `json:"endpoint,omitempty"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	// K is the runs per scenario (the k of pass@k).
	K         int               `json:"k"`
	Trials    int               `json:"trials"`
	Resolved  int               `json:"resolved"`
	PassRate  float64           `json:"pass_rate"`
	CI95      Interval          `json:"ci95"`
	PassAtK   float64           `json:"pass_at_k"` // mean over scenarios
	MedianTTF *float64          `json:"median_time_to_fix_seconds"`
	Harness   int               `json:"harness_errors"`
	Tokens    int               `json:"tokens"`
	Scenarios []ScenarioSummary `json:"scenarios"`
	// Forks, with --fork: each scenario's one injection and fork.
	Forks []ForkSummary `json:"forks,omitempty"`
}

// Summarize computes the summary of a run's trials.
func Summarize(results []TrialResult) *Summary {
	s := &Summary{}
	byID := map[string][]TrialResult{}
	var ids []string
	var ttfAll []float64
	for _, r := range results {
		if _, ok := byID[r.Scenario]; !ok {
			ids = append(ids, r.Scenario)
		}
		byID[r.Scenario] = append(byID[r.Scenario], r)
		s.Agent, s.Model, s.Endpoint = r.Agent, r.Model, r.Endpoint
		s.Trials++
		s.Tokens += r.PromptTokens + r.CompletionTokens
		if r.Resolved {
			s.Resolved++
			ttfAll = append(ttfAll, *r.TimeToFix)
		}
		if r.FailureMode == FailHarness {
			s.Harness++
		}
	}
	slices.Sort(ids)
	k := 0
	for _, id := range ids {
		rs := byID[id]
		k = max(k, len(rs))
	}
	var passK float64
	for _, id := range ids {
		rs := byID[id]
		ss := ScenarioSummary{ID: id, Title: rs[0].Title, Category: rs[0].Category, Difficulty: rs[0].Difficulty, Trials: len(rs),
			FailureModes: map[string]int{}}
		var ttf, turns []float64
		for _, r := range rs {
			turns = append(turns, float64(r.Turns))
			if r.Resolved {
				ss.Resolved++
				ttf = append(ttf, *r.TimeToFix)
			} else {
				ss.FailureModes[r.FailureMode]++
			}
		}
		ss.PassRate = round4(float64(ss.Resolved) / float64(ss.Trials))
		ss.CI95 = Wilson(ss.Resolved, ss.Trials)
		ss.PassAtK = PassAtK(ss.Trials, ss.Resolved, min(k, ss.Trials))
		ss.MedianTTF, ss.MedianTurns = median(ttf), median(turns)
		passK += ss.PassAtK
		s.Scenarios = append(s.Scenarios, ss)
	}
	s.K = k
	if s.Trials > 0 {
		s.PassRate = round4(float64(s.Resolved) / float64(s.Trials))
		s.PassAtK = round4(passK / float64(len(ids)))
	}
	s.CI95 = Wilson(s.Resolved, s.Trials)
	s.MedianTTF = median(ttfAll)
	return s
}

// WriteSummary writes summary.json and summary.md into dir.
func WriteSummary(dir string, s *Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	WriteMarkdown(&md, s, nil)
	return os.WriteFile(filepath.Join(dir, "summary.md"), []byte(md.String()), 0o644)
}

func pct(x float64) string { return fmt.Sprintf("%.0f %%", x*100) }

func secs(x *float64) string {
	if x == nil {
		return "–"
	}
	return fmt.Sprintf("%.1f s", *x)
}

// WriteMarkdown writes the summary table (and, with results, a line per
// trial linking its trace).
func WriteMarkdown(w io.Writer, s *Summary, results []TrialResult) {
	title := s.Agent
	if s.Model != "" {
		title += " · " + s.Model
	}
	fmt.Fprintf(w, "# vmgate agent benchmark: %s\n\n", title)
	fmt.Fprintf(w, "%d scenarios × %d runs: **%d of %d resolved, %s** (95 %% CI %s–%s), pass@%d %s, median time-to-fix %s",
		len(s.Scenarios), s.K, s.Resolved, s.Trials, pct(s.PassRate), pct(s.CI95.Lo), pct(s.CI95.Hi), s.K, pct(s.PassAtK), secs(s.MedianTTF))
	if s.Harness > 0 {
		fmt.Fprintf(w, "; **%d harness errors** (trials that say nothing about the agent)", s.Harness)
	}
	fmt.Fprintf(w, ".\n\n| scenario | difficulty | resolved | pass rate | 95 %% CI | pass@%d | median time-to-fix | median turns | failures |\n", s.K)
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, ss := range s.Scenarios {
		fmt.Fprintf(w, "| %s | %s | %d/%d | %s | %s–%s | %s | %s | %s | %s |\n", ss.ID, ss.Difficulty, ss.Resolved, ss.Trials,
			pct(ss.PassRate), pct(ss.CI95.Lo), pct(ss.CI95.Hi), pct(ss.PassAtK), secs(ss.MedianTTF), turnsText(ss.MedianTurns), modesText(ss.FailureModes))
	}
	if len(s.Forks) > 0 {
		fmt.Fprint(w, "\n## Forks\n\nEach scenario's fault was injected once and the broken VM forked into one copy per run.\n\n")
		fmt.Fprintln(w, "| scenario | copies | inject once | fork | inject k times (estimate) | copy PSS | copy RSS |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
		for _, f := range s.Forks {
			fmt.Fprintf(w, "| %s | %d | %.1f s | %.2f s | %.1f s | %.0f MiB | %.0f MiB |\n", f.Scenario, f.Copies, f.InjectSeconds, f.ForkSeconds, f.InjectKSeconds, f.CopyPSSMiB, f.CopyRSSMiB)
		}
	}
	if len(results) == 0 {
		return
	}
	fmt.Fprintln(w, "\n## Trials\n\n| scenario | run | resolved | failure | turns | tool calls (invalid, as text) | agent time | trace | receipts |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
	for _, r := range results {
		fmt.Fprintf(w, "| %s | %d | %s | %s | %d | %d (%d, %d) | %.1f s | [%s](%s) | %s |\n", r.Scenario, r.Run, yesNo(r.Resolved), r.FailureMode,
			r.Turns, r.ToolCalls, r.InvalidToolCalls, r.TextToolCalls, r.AgentSeconds, r.Trace, r.Trace, receiptsText(r))
	}
	fmt.Fprintf(w, "\nEach trial's commands have signed receipts in its receipts directory; `vmgated receipt verify DIR --key DIR/%s --audit DIR/audit.jsonl` checks them.\n", ReceiptKeyFile)
}

// receiptsText links a trial's receipts, and says how many were refused.
func receiptsText(r TrialResult) string {
	if r.Receipts == "" {
		return "–"
	}
	s := fmt.Sprintf("[%d](%s/)", r.ReceiptCount, r.Receipts)
	if n := len(r.ReceiptErrors); n > 0 {
		s += fmt.Sprintf(" (%d refused)", n)
	}
	return s
}

func turnsText(x *float64) string {
	if x == nil {
		return "–"
	}
	return fmt.Sprintf("%g", *x)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func modesText(m map[string]int) string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
