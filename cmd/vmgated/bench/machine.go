package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// A session as a machine, in the sessions part's daemon, on a session of
// its own:
//   - session_concurrent_ms: a command `true` → answered, while three
//     commands (sleep) run in the same session;
//   - detach_ms: a background process's start (vm-exec --detach) → its
//     handle;
//   - logs_ms: the whole output of a finished background process that
//     wrote 64 KiB → read.

// machineSession is the session of the machine figures.
const machineSession = "machine"

// machine measures the figures above, runs samples each.
func (s sessionRun) machine(ctx context.Context, runs int) error {
	rep := s.rep
	s.step("session as a machine: commands at once, background processes")
	if err := s.run(ctx, machineSession, "true"); err != nil {
		return err
	}
	// Three long commands run beside the timed ones; they end when ctx
	// does, or after the figures.
	bg, stop := context.WithCancel(ctx)
	defer stop()
	for range 3 {
		go func() { _ = s.run(bg, machineSession, "sleep 600") }()
	}
	if err := waitCommands(ctx, s.c, 3); err != nil {
		return err
	}
	var conc, detach, logs []time.Duration
	for range runs {
		t0 := time.Now()
		if err := s.run(ctx, machineSession, "true"); err != nil {
			return err
		}
		conc = append(conc, time.Since(t0))
	}
	stop()
	rep.SessionConcurrentMS = summarize(conc)
	for range runs {
		t0 := time.Now()
		p, err := s.c.StartProc(ctx, machineSession, wire.ExecRequest{Argv: []string{"sleep", "600"}})
		if err != nil {
			return err
		}
		detach = append(detach, time.Since(t0))
		if err := s.c.ProcSignal(ctx, machineSession, p.Handle, "KILL"); err != nil {
			return err
		}
	}
	rep.DetachMS = summarize(detach)
	p, err := s.c.StartProc(ctx, machineSession, wire.ExecRequest{Argv: []string{"head", "-c", "65536", "/dev/zero"}})
	if err != nil {
		return err
	}
	if end, err := s.c.ProcWait(ctx, machineSession, p.Handle, time.Minute); err != nil || end.StdoutBytes != 65536 {
		return fmt.Errorf("the 64 KiB process: %+v %v", end, err)
	}
	for range runs {
		t0 := time.Now()
		n := 0
		if err := s.c.ProcLogs(ctx, machineSession, p.Handle, 0, 0, false, func(o wire.ProcOutput) error {
			for _, c := range o.Chunks {
				n += len(c.Data)
			}
			return nil
		}); err != nil {
			return err
		}
		if n != 65536 {
			return fmt.Errorf("logs of the 64 KiB process read %d bytes", n)
		}
		logs = append(logs, time.Since(t0))
	}
	rep.LogsMS = summarize(logs)
	return s.c.EndSession(ctx, machineSession)
}

// waitCommands waits until the machine session runs n commands.
func waitCommands(ctx context.Context, c *client.Client, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ss, err := c.Sessions(ctx)
		if err != nil {
			return err
		}
		for _, s := range ss {
			if s.Name == machineSession && s.Commands >= n {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the session runs fewer than %d commands after 2 min", n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
