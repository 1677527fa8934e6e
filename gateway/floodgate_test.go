package gateway

import (
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
)

func TestFloodGate(t *testing.T) {
	g := newFloodGate("denied requests", 2, 3)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	uid := uint32(7)
	rec := audit.Record{Kind: audit.KindDecision, Verdict: audit.VerdictDeny, UID: &uid, Argv: []string{"rm"}, Reason: "no"}
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	// The burst, then one record per 500 ms; what is over is held.
	var wrote, held int
	for i := range 10 {
		w, sum := g.admit("uid:7", rec, at(i)) // 10 within 10 ms
		if sum != nil {
			t.Fatalf("summary at %d before any token came back", i)
		}
		if w {
			wrote++
		} else {
			held++
		}
	}
	if wrote != 3 || held != 7 {
		t.Fatalf("wrote %d, held %d; want the burst of 3 and 7 held", wrote, held)
	}
	// Another key is not affected.
	if w, _ := g.admit("uid:8", rec, at(10)); !w {
		t.Fatal("another caller was held back")
	}
	// 500 ms later a token is back: the record goes, after a summary of
	// the 7 held.
	w, sum := g.admit("uid:7", rec, at(510))
	if !w || sum == nil {
		t.Fatalf("after a token came back: write %v, summary %v", w, sum)
	}
	if !strings.HasPrefix(sum.Message, "7 more denied requests not recorded one by one") || *sum.UID != 7 || sum.Argv != nil || sum.Reason != "" ||
		sum.Verdict != audit.VerdictDeny || !strings.Contains(sum.Message, "from 2026-12-01T12:00:00.003Z to 2026-12-01T12:00:00.009Z") {
		t.Errorf("summary %+v", sum)
	}
	// Held again, then the source goes quiet: sweep writes the summary,
	// flush of a key without held records writes none.
	g.admit("uid:7", rec, at(520))
	if got := g.sweep(at(500)); len(got) != 0 {
		t.Fatalf("swept a key active after the cut: %v", got)
	}
	if got := g.sweep(at(3000)); len(got) != 1 || !strings.HasPrefix(got[0].Message, "1 more denied requests") {
		t.Fatalf("sweep = %+v", got)
	}
	if r := g.flush("uid:8"); r != nil {
		t.Fatalf("flush without held records: %+v", r)
	}
}
