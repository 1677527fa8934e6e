package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

// loadPolicy lets one caller use every VM (the load comes from one uid).
const loadPolicy = `version = 1

[[profile]]
name = "load"
match = { any = true }
max_vms = 2
max_vms_per_caller = 2
max_queued_per_caller = 8
allow_shell = true
`

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestGateway_Load sends 200 concurrent vm-exec one-shots to a daemon
// with two VM slots and a short queue: each gets its command's exit code
// or busy (202), none hangs or fails otherwise, and afterwards the
// daemon's open files and heap are back near where they started.
func TestGateway_Load(t *testing.T) {
	bin := os.Getenv("VMGATE_TEST_BIN")
	if bin == "" {
		t.Skip("VMGATE_TEST_BIN not set")
	}
	d := gatewaytest.Start(t, loadPolicy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 2, testutil.TemplateDir(t)
		c.QueueLen, c.QueueWait = 8, 10*time.Second
	})
	ctx := context.Background()
	// Warm: the template and the pool, so that admitted requests restore.
	d.MustExec(t, wire.ExecRequest{Argv: []string{"true"}}, nil)
	if err := d.WaitPool(ctx, 2); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	fdsBefore := openFDs(t)

	const clients = 200
	type outcome struct {
		code, want int
		d          time.Duration
		stderr     string
	}
	results := make([]outcome, clients)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := i % 7
			cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(cctx, filepath.Join(bin, "vm-exec"), "--socket", d.Socket, "sh", "-c", "exit "+strconv.Itoa(want))
			var se bytes.Buffer
			cmd.Stderr = &se
			start := time.Now()
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				code = -1
			}
			results[i] = outcome{code: code, want: want, d: time.Since(start), stderr: se.String()}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	var ran, busy int
	var lat []time.Duration
	for i, r := range results {
		switch r.code {
		case r.want:
			ran++
			lat = append(lat, r.d)
		case wire.ExitBusy:
			busy++
		default:
			t.Errorf("client %d: exit %d, want %d or busy: %s", i, r.code, r.want, r.stderr)
		}
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	t.Logf("load: %d clients in %v: %d ran (%.0f per minute), %d busy; latency of those that ran p50 %v p99 %v",
		clients, elapsed.Round(time.Millisecond), ran, float64(ran)/elapsed.Minutes(), busy, pct(0.50).Round(time.Millisecond), pct(0.99).Round(time.Millisecond))
	if ran == 0 {
		t.Error("no client ran its command")
	}

	// The fresh VMs go after their results: wait for the daemon to have
	// only its pool left, then compare.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := d.Client.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.VMs) == 0 && st.Waiting == 0 && st.LiveVMs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not settle: %d live VMs, %d waiting, %d running", st.LiveVMs, st.Waiting, len(st.VMs))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := d.WaitPool(ctx, 2); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	if fds := openFDs(t); fds > fdsBefore+2 {
		t.Errorf("open files: %d before, %d after the load", fdsBefore, fds)
	}
	if grow := int64(after.HeapInuse) - int64(before.HeapInuse); grow > 32<<20 {
		t.Errorf("heap in use grew by %d MiB under load", grow>>20)
	}
	fmt.Fprintf(os.Stderr, "load: heap in use %d -> %d KiB, fds %d -> %d\n", before.HeapInuse>>10, after.HeapInuse>>10, fdsBefore, openFDs(t))
}
