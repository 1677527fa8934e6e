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
	// the state is saved only once the agent has finished with it
	// (handBack).
	if err := v.handBack(ctx, q); err != nil {
		return v.fail("template save", nil, err)
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

// handBack closes the agent connection and waits until the guest agent
// has finished with it: the agent closes its port once no goroutine of the
// connection uses it, and opens it again before it waits for the next host
// (agent.devicePort); QEMU reports each as VSERPORT_CHANGE. A VM saved any
// earlier would wake with the old connection's bytes or goroutines still
// in the guest; saved between the close and the reopen, it reopens the
// port when it runs again, before the next host is served.
//
// QEMU rate-limits VSERPORT_CHANGE per port (one a second, the later ones
// of a second folded into the last of them), so the close and the reopen
// can arrive as one event, open, a second late: the first event of the
// port stamped after the hang-up says the close happened, whatever it
// reports. Waiting for the close and then the reopen as two events missed
// the close whenever an event (a restore's) had come less than a second
// before, and always cost the second the reopen's event was held back.
// The stamp, not the arrival, tells: an event QEMU held back from before
// the hang-up (a previous hand-back's reopen) can arrive after it. Both
// stamps are the host's wall clock; should it step back in between, the
// wait ends at its limit with an error and the VM runs on.
func (v *VM) handBack(ctx context.Context, q *qmp) error {
	return v.awaitHandBack(ctx, q, v.hangUp(), false)
}

// hangUp closes the agent connection: the first half of handBack. It
// returns when it did, for awaitHandBack.
func (v *VM) hangUp() time.Time {
	since := time.Now()
	v.detach()
	return since
}

// handBackLimit bounds the wait for the guest agent's port event.
const handBackLimit = 30 * time.Second

// awaitHandBack waits for the port event that ends a hand-back begun at
// since (hangUp), unless seen says it came already (read past by another
// command on q: isHandBack).
func (v *VM) awaitHandBack(ctx context.Context, q *qmp, since time.Time, seen bool) error {
	if seen {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, handBackLimit)
	defer cancel()
	if err := q.waitEvent(ctx, "VSERPORT_CHANGE", func(ev qmpReply) bool { return isHandBack(ev, since) }); err != nil {
		return fmt.Errorf("the guest agent did not close its port after the host hung up: %w", err)
	}
	return nil
}

// isHandBack tells whether ev ends a hand-back begun at since.
func isHandBack(ev qmpReply, since time.Time) bool { return portEventAfter(ev, AgentPortID, since) }

// portEventAfter tells whether ev is a VSERPORT_CHANGE of the port id
// that QEMU stamped at or after t.
func portEventAfter(ev qmpReply, id string, t time.Time) bool {
	var d struct {
		ID string `json:"id"`
	}
	return ev.Event == "VSERPORT_CHANGE" && json.Unmarshal(ev.Data, &d) == nil && d.ID == id && !ev.stamp().Before(t.Truncate(time.Microsecond))
}
