package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/internal/testutil"
)

// wedgeSlack is what a request may take beyond the host's bound on the
// agent (TCG, a loaded host).
const wedgeSlack = 20 * time.Second

// wedgeExitAfter is how long the wedged command runs before the hostile
// agent reports its exit: the signal flood is sent in that time.
const wedgeExitAfter = 10 * time.Second

// wedgeSignals is the size of the signal flood: the number that made
// 200,000 stuck goroutines (security round 3, finding 1).
const wedgeSignals = 200_000

// TestGateway_WedgedAgent: in a session, a guest root puts its own agent
// (guest/wedgeagent) in the real one's place on the agent's port,
// without the host seeing a change. It accepts the next command, whose
// client floods it with signals and then writes stdin without end,
// stops reading its port, and reports the command's exit (security round
// 3, finding 1). Through the daemon, on a real VM:
//   - the wedged command returns its exit, and the signal flood leaves
//     the daemon's goroutines bounded;
//   - the next request on the session, a --get (the daemon asks the agent
//     whether it copies files: vm.VM.CanTransfer), ends within the host's
//     bound on the agent and says why; the session is gone, and its next
//     use runs in a new VM;
//   - the session's VM slot is free: a fresh request runs at max 1 VM;
//   - nothing stays stuck: the goroutines are back, and a graceful
//     shutdown ends within its grace.
func TestGateway_WedgedAgent(t *testing.T) {
	testutil.RequiresImage(t)
	if os.Getenv("VMGATE_TEST_BIN") == "" {
		t.Skip("VMGATE_TEST_BIN not set")
	}
	agent := testutil.BuildStatic(t, "github.com/vmgate/vmgate/guest/wedgeagent", "")
	const grace = 5 * time.Second
	// Restored VMs (the shared test templates); one VM at most, so that
	// a slot the wedged session kept would show.
	d := gatewaytest.Start(t, testPolicy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 0, testutil.TemplateDir(t)
		c.MaxVMs, c.Grace = 1, grace
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	work := filepath.Dir(agent)
	bound := agentconn.WriteTimeout + wedgeSlack
	baseline := runtime.NumGoroutine()

	// The takeover: the command that runs the hostile agent returns the
	// status only it reports.
	if _, se, code, took := vmExecWithin(t, 3*time.Minute, d.Socket, work, "--session", "s", "-n", "--put", "wedgeagent:/tmp/wedgeagent",
		"--", "/tmp/wedgeagent", "-status", "42", "-exit-after", wedgeExitAfter.String()); code != 42 {
		t.Fatalf("the takeover: exit %d after %v, stderr %q; want 42", code, took, se)
	}

	// The wedged command: its client sends the signals once the command
	// runs (its first output), and then stdin without end.
	running, flooded, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	signals := make(chan string)
	t0 := time.Now()
	var floodAt time.Duration // when the last signal was sent
	go func() {
		select {
		case <-running:
		case <-done:
			return
		}
		for range wedgeSignals {
			select {
			case signals <- "INT":
			case <-done:
				return
			}
		}
		floodAt = time.Since(t0)
		close(flooded)
	}()
	res, err := d.Client.Exec(ctx, wire.ExecRequest{Argv: []string{"cat"}, Session: "s"},
		client.ExecIO{Stdin: &endlessStdin{after: flooded, done: done}, Stdout: &firstWrite{ch: running}, Signals: signals})
	took := time.Since(t0)
	peak := runtime.NumGoroutine()
	close(done)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("the wedged command: %+v %v", res, err)
	}
	if took > bound {
		t.Errorf("the wedged command took %v, want at most %v", took, bound)
	}
	select {
	case <-flooded:
	default:
		t.Fatalf("the wedged command ended (after %v) before its client sent %d signals", took, wedgeSignals)
	}
	t.Logf("the wedged command: exit %d after %v (the signals sent by %v); %d goroutines, %d before",
		res.ExitCode, took.Round(time.Millisecond), floodAt.Round(time.Millisecond), peak, baseline)
	if peak-baseline > 500 {
		t.Errorf("%d goroutines after %d signals to the wedged command, %d before", peak, wedgeSignals, baseline)
	}

	// The next request on the session asks the wedged agent.
	get := t.TempDir()
	_, se, code, took := vmExecWithin(t, 2*bound, d.Socket, get, "--session", "s", "-n", "--get", "/etc/hostname:./hostname", "true")
	t.Logf("the --get: exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(se))
	if took > bound {
		t.Errorf("the --get on the wedged session took %v, want at most %v", took, bound)
	}
	// Its VM's failure, not a transfer's (206 says the command ran).
	if code != wire.ExitVMFailed || !strings.Contains(se, "agent") {
		t.Errorf("the --get on the wedged session: exit %d, stderr %q; want %d, saying why", code, se, wire.ExitVMFailed)
	}
	if _, err := os.Lstat(filepath.Join(get, "hostname")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the failed --get left a file: %v", err)
	}
	st, err := d.Client.Status(ctx)
	if err != nil || len(st.Sessions) != 0 || st.LiveVMs != 0 {
		t.Fatalf("after the wedged session's end: %+v %v; want no session, no VM", st, err)
	}

	// Its slot is free, and its name starts a new session.
	if so, se, code, took := vmExecWithin(t, bound, d.Socket, work, "-n", "echo", "fresh"); code != 0 || so != "fresh\n" {
		t.Fatalf("a fresh request after the wedge: exit %d after %v, %q %q", code, took, so, se)
	}
	if _, se, code, took := vmExecWithin(t, bound, d.Socket, work, "--session", "s", "-n", "test", "!", "-e", "/tmp/wedgeagent"); code != 0 {
		t.Fatalf("the session's next use: exit %d after %v, %q; want a new VM", code, took, se)
	}
	if err := d.Client.EndSession(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	if n := runtime.NumGoroutine(); n-baseline > 50 {
		t.Errorf("%d goroutines once the wedged VM is gone, %d before", n, baseline)
	}

	t0 = time.Now()
	d.StopAndCheck(t)
	if took := time.Since(t0); took > grace+wedgeSlack {
		t.Errorf("the shutdown took %v, grace %v", took, grace)
	}
}

// endlessStdin is a client's stdin that starts once after is closed and
// then never ends (until done).
type endlessStdin struct {
	after, done <-chan struct{}
}

func (r *endlessStdin) Read(p []byte) (int, error) {
	select {
	case <-r.after:
	case <-r.done:
		return 0, errors.New("the command is over")
	}
	select {
	case <-r.done:
		return 0, errors.New("the command is over")
	default:
	}
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// vmExecWithin runs the built vm-exec in dir against socket, and kills it
// at limit (the test then fails).
func vmExecWithin(t *testing.T, limit time.Duration, socket, dir string, args ...string) (stdout, stderr string, code int, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(os.Getenv("VMGATE_TEST_BIN"), "vm-exec"), append([]string{"--socket", socket}, args...)...)
	cmd.Dir = dir
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	t0 := time.Now()
	err := cmd.Run()
	took = time.Since(t0)
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("vm-exec %q did not end within %v", args, limit)
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return so.String(), se.String(), code, took
}
