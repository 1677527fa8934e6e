package vm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// save detaches from the agent, stops the guest and writes its device
// state to TemplateStateFile; QEMU then quits.
func (v *VM) save(ctx context.Context) error {
	q, err := dialQMP(ctx, filepath.Join(v.Dir, QMPSocket), v.exited)
	if err != nil {
		return fmt.Errorf("template save: %w", err)
	}
	defer q.Close()
	// Each clone makes a new agent connection, so this one ends here, and
	// the state is saved only once the agent has finished with it and
	// waits for the next host (handBack).
	if err := v.handBack(ctx, q); err != nil {
		return v.fail("template save", nil, err)
	}
	if err := v.settle(ctx); err != nil {
		return fmt.Errorf("template save: %w", err)
	}
	sf, err := os.OpenFile(filepath.Join(v.Dir, TemplateStateFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("template save: %w", err)
	}
	defer sf.Close()
	err = runCalls(ctx, q, []qmpCall{
		{"stop", nil, nil},
		{"migrate-set-capabilities", ignoreShared, nil},
		{"getfd", map[string]any{"fdname": "state"}, []int{int(sf.Fd())}},
	})
	if err != nil {
		return fmt.Errorf("template save: %w", err)
	}
	if err := q.runMigration(ctx, "migrate", map[string]any{"uri": "fd:state"}); err != nil {
		return fmt.Errorf("template save: %w", err)
	}
	if err := sf.Sync(); err != nil {
		return fmt.Errorf("template save: %w", err)
	}
	_, _ = q.run(ctx, "quit", nil)
	select {
	case <-v.exited:
	case <-time.After(10 * time.Second):
		_ = v.Kill()
		<-v.exited
	}
	// The RAM file must be complete on disk before it is reused. It is
	// QEMU's, in the VM's directory (openQEMUFile).
	f, err := openQEMUFile(filepath.Join(v.Dir, RAMFile), os.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = f.Sync()
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("template save: %w", err)
	}
	return nil
}

// templateSettle is how long a template's guest runs after the hand-back
// before it is saved. The hand-back's close and reopen of the agent's
// port set off work in the guest that ends within about 200 ms here
// (under TCG): the agent's goroutines and Go's runtime winding down, the
// kernel's deferred work for the port and the processes the quiesce ran.
// Saved before it ends, every clone of the template runs the rest of it
// on code QEMU has not translated yet, while its agent answers its first
// host: 9-10 ms of each restore's agent step here (docs/benchmarks.md,
// "The agent step, fixed"). Save points are not settled: a pause's time is
// its caller's, and one restore follows it.
const templateSettle = 500 * time.Millisecond

// settle lets a template's guest run for templateSettle after the
// hand-back; it fails when ctx ends or QEMU exits first.
func (v *VM) settle(ctx context.Context) error {
	t := time.NewTimer(templateSettle)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-v.exited:
		return v.died("before the template save")
	}
}

// qmpCall is one QMP command of a sequence: its arguments, and the fds
// passed with it.
type qmpCall struct {
	cmd  string
	args any
	fds  []int
}

// runCalls runs calls on q in order, up to the first that fails.
func runCalls(ctx context.Context, q *qmp, calls []qmpCall) error {
	for _, c := range calls {
		if _, err := q.run(ctx, c.cmd, c.args, c.fds...); err != nil {
			return err
		}
	}
	return nil
}
