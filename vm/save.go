package vm

import (
	"context"
	"encoding/json"
	"fmt"
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
	// the state is saved only once the agent has finished with it: the
	// agent closes its port and opens it again before it waits for the
	// next host (agent.devicePort), and QEMU reports both as
	// VSERPORT_CHANGE. Saved any earlier, a clone would wake with the old
	// connection's bytes or goroutines still in the guest.
	v.detach()
	if err := waitPortReopened(ctx, q); err != nil {
		return v.fail("template save", nil, fmt.Errorf("the guest agent did not reopen its port after the host hung up: %w", err))
	}
	sf, err := os.OpenFile(filepath.Join(v.Dir, TemplateStateFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("template save: %w", err)
	}
	defer sf.Close()
	steps := []struct {
		cmd  string
		args any
		fds  []int
	}{
		{"stop", nil, nil},
		{"migrate-set-capabilities", ignoreShared, nil},
		{"getfd", map[string]any{"fdname": "state"}, []int{int(sf.Fd())}},
	}
	for _, s := range steps {
		if _, err := q.run(ctx, s.cmd, s.args, s.fds...); err != nil {
			return fmt.Errorf("template save: %w", err)
		}
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
	// The RAM file must be complete on disk before it is reused.
	if f, err := os.Open(filepath.Join(v.Dir, RAMFile)); err == nil {
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("template save: %w", err)
		}
	}
	return nil
}

// waitPortReopened waits for the guest to close the agent port and open it
// again.
func waitPortReopened(ctx context.Context, q *qmp) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, open := range []bool{false, true} {
		err := q.waitEvent(ctx, "VSERPORT_CHANGE", func(data json.RawMessage) bool {
			var ev struct {
				ID   string `json:"id"`
				Open bool   `json:"open"`
			}
			return json.Unmarshal(data, &ev) == nil && ev.ID == AgentPortID && ev.Open == open
		})
		if err != nil {
			return err
		}
	}
	return nil
}
