package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// What a signed receipt adds to a request (part "daemon").

// ReceiptBudgetMS is what a receipt may add to a command (issue 32).
const ReceiptBudgetMS = 2

// receiptOverhead measures what a receipt adds to a request, pairs of
// requests without and with one in alternating order: refused ones (a
// timeout over the policy's maximum), then `true` in a session; and
// fills in rep's receipt figures.
func receiptOverhead(ctx context.Context, c *client.Client, pairs int, rep *ExecReport) error {
	const session = "bench-receipts"
	defer func() {
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_ = c.EndSession(ectx, session)
	}()
	refused := wire.ExecRequest{Argv: []string{"true"}, TimeoutMS: (24 * time.Hour).Milliseconds()}
	refusal := func(receipt bool) (time.Duration, error) {
		req := refused
		req.Receipt = receipt
		t0 := time.Now()
		_, err := c.Exec(ctx, req, client.ExecIO{})
		d := time.Since(t0)
		switch {
		case !errors.Is(err, client.ErrDenied):
			return 0, fmt.Errorf("receipt overhead: a timeout over the maximum was not refused: %v", err)
		case receipt && len(client.ReceiptOf(err)) == 0:
			return 0, errors.New("receipt overhead: the refusal carried no receipt")
		}
		return d, nil
	}
	inSession := func(receipt bool) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
		defer cancel()
		t0 := time.Now()
		res, err := c.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}, Session: session, Receipt: receipt}, client.ExecIO{})
		d := time.Since(t0)
		switch {
		case err != nil:
			return 0, fmt.Errorf("receipt overhead: %w", err)
		case receipt && len(res.Receipt) == 0:
			return 0, errors.New("receipt overhead: no receipt came")
		}
		return d, nil
	}
	if _, err := inSession(false); err != nil { // the session's VM, and a first command
		return err
	}
	var err error
	if rep.RefusalNoReceiptMS, rep.RefusalReceiptMS, rep.ReceiptOverheadMS, err = measurePairs(pairs, refusal); err != nil {
		return err
	}
	if rep.SessionNoReceiptMS, rep.SessionReceiptMS, rep.ReceiptOverheadSessionMS, err = measurePairs(pairs, inSession); err != nil {
		return err
	}
	if rep.ReceiptOverheadMS >= ReceiptBudgetMS {
		rep.Notes = append(rep.Notes, fmt.Sprintf("a receipt costs %.2f ms per request, over its %d ms budget", rep.ReceiptOverheadMS, ReceiptBudgetMS))
	}
	return nil
}

// measurePairs runs pairs of run(false), run(true), the order alternating
// from pair to pair, and returns both distributions and the median of
// the pairs' differences.
func measurePairs(pairs int, run func(receipt bool) (time.Duration, error)) (without, with Stat, overhead float64, err error) {
	var a, b []time.Duration
	for i := range pairs {
		order := []bool{false, true}
		if i%2 == 1 {
			order = []bool{true, false}
		}
		for _, receipt := range order {
			d, err := run(receipt)
			if err != nil {
				return Stat{}, Stat{}, 0, err
			}
			if receipt {
				b = append(b, d)
			} else {
				a = append(a, d)
			}
		}
	}
	return summarize(a), summarize(b), pairedMedian(a, b), nil
}

// pairedMedian is the median, in milliseconds, of b[i]-a[i].
func pairedMedian(a, b []time.Duration) float64 {
	n := min(len(a), len(b))
	if n == 0 {
		return 0
	}
	d := make([]float64, n)
	for i := range n {
		d[i] = float64((b[i] - a[i]).Microseconds()) / 1000
	}
	slices.Sort(d)
	if n%2 == 1 {
		return d[n/2]
	}
	return math.Round((d[n/2-1]+d[n/2])/2*1000) / 1000
}
