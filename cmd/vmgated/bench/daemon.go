package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/inproc"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
)

// Figures through the real daemon, in this process (gateway/inproc; part
// "daemon"): one-shot commands from a warm pool and restored, without and
// with a network, the throughput at each concurrency, and what a receipt
// adds (receipts.go).

// daemons measures through the daemon: one-shots with a pool (and
// throughput), without one, and the same through a profile with a network.
func (r *execRun) daemons(ctx context.Context) error {
	o, rep := r.o, r.rep
	throughputs := func(c *client.Client, waitPool func() error) error {
		for _, conc := range o.Concurrency {
			if err := waitPool(); err != nil {
				return err
			}
			r.step("throughput at concurrency %d", conc)
			tp, err := throughput(ctx, c, conc, max(o.Runs, 2*conc))
			if err != nil {
				return err
			}
			rep.Throughput = append(rep.Throughput, tp)
		}
		return nil
	}
	for _, d := range []struct {
		name    string
		network bool
		pool    int
		stat    *Stat
		parts   *map[string]Stat
		then    func(*client.Client, func() error) error
	}{
		{"pool", false, o.PoolSize, &rep.OneshotPoolMS, &rep.OneshotPoolPartsMS, func(c *client.Client, waitPool func() error) error {
			if err := throughputs(c, waitPool); err != nil {
				return err
			}
			r.step("receipt overhead")
			return receiptOverhead(ctx, c, max(o.Runs, 30), rep)
		}},
		{"nopool", false, 0, &rep.OneshotNoPoolMS, &rep.OneshotNoPoolPartsMS, nil},
		{"netpool", true, o.PoolSize, &rep.OneshotNetPoolMS, &rep.OneshotNetPoolPartsMS, nil},
		{"netnopool", true, 0, &rep.OneshotNetNoPoolMS, &rep.OneshotNetNoPoolPartsMS, nil},
	} {
		r.step("daemon %s (network %v, pool of %d)", d.name, d.network, d.pool)
		var err error
		if *d.stat, *d.parts, err = daemonOneshots(ctx, o, r.work, d.name, d.network, d.pool, rep, d.then); err != nil {
			return err
		}
	}
	return nil
}

// daemonOneshots starts a daemon with a pool of pool VMs (0: each request
// restores its VM) and times one-shot commands through it, which must get
// VMs from the pool or restored; then runs then, if set.
func daemonOneshots(ctx context.Context, o ExecOptions, work, name string, network bool, pool int, rep *ExecReport, then func(*client.Client, func() error) error) (Stat, map[string]Stat, error) {
	var st Stat
	var parts map[string]Stat
	err := withDaemon(ctx, o, work, name, pool, network, rep, func(c *client.Client, waitPool func() error) error {
		want, before := "pool", waitPool
		if pool == 0 {
			// The template is loaded (or built) when the pool of zero
			// is listed; then every request restores.
			if err := waitPool(); err != nil {
				return err
			}
			want, before = "restore", nil
		}
		var err error
		if st, parts, err = sampleOneshots(ctx, c, o.Runs, want, before); err != nil {
			return err
		}
		if then != nil {
			return then(c, waitPool)
		}
		return nil
	})
	return st, parts, err
}

// sampleOneshots times runs one-shot commands, each after before (if
// set), and requires each VM to have been made the way want says.
func sampleOneshots(ctx context.Context, c *client.Client, runs int, want string, before func() error) (Stat, map[string]Stat, error) {
	var d []time.Duration
	parts := newParts()
	for i := 0; i < runs; i++ {
		if before != nil {
			if err := before(); err != nil {
				return Stat{}, nil, err
			}
		}
		t1 := time.Now()
		res, err := oneshot(ctx, c)
		if err != nil {
			return Stat{}, nil, err
		}
		if res.VMStart != want {
			return Stat{}, nil, fmt.Errorf("one-shot got a VM by %q, want %q", res.VMStart, want)
		}
		d = append(d, time.Since(t1))
		parts.add(res)
	}
	return summarize(d), parts.stats(), nil
}

// parts collects the daemon's timings of one-shot results.
type parts map[string][]time.Duration

func newParts() parts { return parts{} }

func (p parts) add(r *wire.Result) {
	p["vm"] = append(p["vm"], time.Duration(r.BootMS)*time.Millisecond)
	p["exec"] = append(p["exec"], time.Duration(r.ExecMS)*time.Millisecond)
	p["daemon_total"] = append(p["daemon_total"], time.Duration(r.TotalMS)*time.Millisecond)
}

func (p parts) stats() map[string]Stat {
	out := map[string]Stat{}
	for k, d := range p {
		out[k] = summarize(d)
	}
	return out
}

func oneshot(ctx context.Context, c *client.Client) (*wire.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	res, err := c.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}}, client.ExecIO{})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", res.ExitCode)
	}
	return res, err
}

// throughput runs n one-shot commands on conc workers.
func throughput(ctx context.Context, c *client.Client, conc, n int) (Throughput, error) {
	jobs := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	var (
		mu       sync.Mutex
		firstErr error
		pooled   int
	)
	var wg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < conc; w++ {
		wg.Go(func() {
			for range jobs {
				res, err := oneshot(ctx, c)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && res.VMStart == "pool" {
					pooled++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	secs := time.Since(t0).Seconds()
	if firstErr != nil {
		return Throughput{}, fmt.Errorf("throughput at %d: %w", conc, firstErr)
	}
	return Throughput{Concurrency: conc, Commands: n, Seconds: math.Round(secs*100) / 100, PerMinute: math.Round(float64(n)/secs*60*10) / 10, FromPool: pooled}, nil
}

// withDaemon runs the real gateway in-process on its own socket with the
// given pool size, on the built-in policy or (network) the built-in
// policy with a network allowlist, and calls fn with a client and a
// function that waits until the pool of that shape is full. The daemon's
// handshake failures are added to rep.
func withDaemon(ctx context.Context, o ExecOptions, work, name string, pool int, network bool, rep *ExecReport, fn func(*client.Client, func() error) error) error {
	d, err := inproc.Start(ctx, inproc.Options{Dir: filepath.Join(work, name), ImageDir: o.ImageDir, TemplateDir: o.TemplateDir,
		Policy: withASLR(benchPolicy(maxVMs(o), network), o.GuestASLR), MaxVMs: maxVMs(o), PoolSize: pool, Ahead: o.Ahead, Accel: o.Accel, TBSizeMiB: o.TBSizeMiB, Log: o.Log})
	if err != nil {
		return err
	}
	err = fn(d.Client, func() error { return d.WaitPoolOf(ctx, pool, network) })
	n, serr := d.HandshakeFailures(ctx)
	rep.RestoreHandshakeFailures += n
	return errors.Join(err, serr, d.Stop())
}

// withASLR sets the policy's isolate.guest_aslr to aslr ("": its default).
func withASLR(text []byte, aslr string) []byte {
	if aslr == "" {
		return text
	}
	return append(text, fmt.Sprintf("\n[isolate]\nguest_aslr = %q\n", aslr)...)
}

// benchPolicy is the built-in policy with room for maxVMs VMs, all for
// the one caller, the benchmark, and with network a network allowlist of
// one name: the benchmark's commands make no connection, so nothing is
// looked up. The built-in policy's own values are replaced whatever they
// are (TestBenchPolicy checks the result).
func benchPolicy(maxVMs int, network bool) []byte {
	text := policy.DefaultTOML()
	for _, key := range []string{"max_vms", "max_vms_per_caller"} {
		re := regexp.MustCompile(`(?m)^` + key + ` = \d+$`)
		text = re.ReplaceAll(text, []byte(fmt.Sprintf("%s = %d", key, maxVMs)))
	}
	if network {
		text = bytes.Replace(text, []byte("\nmode = \"none\"\n"), []byte("\nmode = \"allowlist\"\nallow = [\"bench.invalid:443\"]\n"), 1)
	}
	return text
}

// maxVMs is the daemon's and the bench policy's VM limit: the highest
// concurrency measured.
func maxVMs(o ExecOptions) int { return max(slices.Max(o.Concurrency), 1) }
