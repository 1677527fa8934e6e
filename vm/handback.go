package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A hand-back ends the host's agent connection before a VM is saved: the
// host hangs up, and the guest agent closes its port once no goroutine of
// the connection uses it, and opens it again before it waits for the
// next host (agent.devicePort). The save waits for both. A VM saved any
// earlier would wake with the old connection's bytes or goroutines still
// in the guest; saved between the close and the reopen, every VM restored
// from it would reopen the port itself, on a guest whose code QEMU has
// not translated yet under TCG: that cost each clone of a template about
// 100 ms of its first contact (docs/benchmarks.md, 2026-12-06), where a
// reopen before the save costs the save once, a few milliseconds.
//
// The host learns of the close and the reopen in one of two ways:
//
//   - The control queue. Opening and closing a virtio-serial port are
//     messages the guest's driver sends the device on its control queue
//     (guest to host, queue 3), and the driver waits until QEMU has taken
//     each. The agent's port is the only one in use on its device, so
//     once the queue's used index has moved two past its value at the
//     hang-up (the close, then the open), the agent has its port open
//     again. QEMU reports the index on request
//     (x-query-virtio-queue-status, QEMU 7.2 and later); the host reads it
//     before the hang-up and then at each step of handBackPoll until it
//     has moved.
//   - The port event. QEMU reports each open and close as VSERPORT_CHANGE,
//     but no more than one a second per port: the later ones of a second
//     are folded into its last and held back until the second is over.
//     So an event of the port stamped after the hang-up that reports the
//     port open says both happened, the close and the reopen; the stamp,
//     not the arrival, tells, as an event held back from before the
//     hang-up (a previous hand-back's reopen) can arrive after it. It is
//     waited for when QEMU does not tell the index, and ends a wait on the
//     queue too if it comes first.
//
// The event alone cost up to a second of every hand-back that came less
// than a second after the port's previous event: a restore's, or the
// previous hand-back's reopen (fork after fork, a pause right after a
// resume; docs/benchmarks.md).

// handBackPoll is how often the control queue is read while a hand-back
// waits for it.
const handBackPoll = 2 * time.Millisecond

// handBackLimit bounds the wait for the guest agent's close and reopen. A
// guest agent does both in milliseconds; one that does not (a guest root
// stopped it) costs its own session, and must not cost the pause worker
// that waits for it more than this: the stop pauses the sessions two at a
// time within its grace period.
const handBackLimit = 5 * time.Second

// serialControlOut is the virtio-serial device's control queue from the
// guest to the host (QEMU's c_ovq: after port 0's two queues and the
// host-to-guest control queue).
const serialControlOut = 3

// handBackMessages is how far the control queue's used index moves in a
// hand-back: the port's close, then its open.
const handBackMessages = 2

// handBackMark is where a hand-back began (hangUp).
type handBackMark struct {
	since time.Time // when the host hung up: events stamped before are older
	// device is the QOM path of the agent's virtio-serial device, "" when
	// QEMU does not report its queues (the port event is then waited for);
	// sent is its control queue's used index before the hang-up.
	device string
	sent   uint16
}

// Ways a hand-back ended (awaitHandBack).
const (
	byControlQueue = "control queue"
	byPortEvent    = "port event"
	// byEarlierEvent: the port event was read by a command between the
	// hang-up and the wait (a save's flatten), before the wait began.
	byEarlierEvent = "port event, read before the wait"
)

// handBack closes the agent connection and waits until the guest agent
// has finished with it and opened its port again.
func (v *VM) handBack(ctx context.Context, q *qmp) error {
	by, err := v.awaitHandBack(ctx, q, v.hangUp(ctx, q), false)
	v.handedBackBy = by
	return err
}

// hangUp closes the agent connection: the first half of handBack. It
// returns the mark awaitHandBack waits from.
func (v *VM) hangUp(ctx context.Context, q *qmp) handBackMark {
	var m handBackMark
	if dev, n, err := controlQueue(ctx, q); err != nil {
		v.log.Debug("the hand-back waits for the port event", "why", err)
	} else {
		m.device, m.sent = dev, n
	}
	m.since = time.Now()
	v.detach()
	return m
}

// awaitHandBack waits until the guest agent has closed its port after the
// hang-up at m and opened it again, unless seen says the port event came
// already (read past by another command on q: isHandBack). It returns
// which way it learnt of it.
func (v *VM) awaitHandBack(ctx context.Context, q *qmp, m handBackMark, seen bool) (string, error) {
	if seen {
		return byEarlierEvent, nil
	}
	ctx, cancel := context.WithTimeout(ctx, handBackLimit)
	defer cancel()
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("the guest agent did not close and reopen its port after the host hung up: %w", err)
	}
	if m.device == "" {
		if err := q.waitEvent(ctx, "VSERPORT_CHANGE", func(ev qmpReply) bool { return isHandBack(ev, m.since) }); err != nil {
			return fail(err)
		}
		return byPortEvent, nil
	}
	prev := q.onEvent
	defer func() { q.onEvent = prev }()
	q.onEvent = func(r qmpReply) {
		seen = seen || isHandBack(r, m.since)
		if prev != nil {
			prev(r)
		}
	}
	for {
		n, err := controlSent(ctx, q, m.device)
		switch {
		case err != nil:
			return fail(err)
		case n-m.sent >= handBackMessages:
			return byControlQueue, nil
		case seen:
			return byPortEvent, nil
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(handBackPoll):
		}
	}
}

// controlQueue returns the QOM path of the VM's virtio-serial device and
// its control queue's used index now (controlSent); an error if this
// QEMU reports neither (before 7.2).
func controlQueue(ctx context.Context, q *qmp) (string, uint16, error) {
	dev, err := serialDevice(ctx, q)
	if err != nil {
		return "", 0, err
	}
	n, err := controlSent(ctx, q, dev)
	return dev, n, err
}

// serialDevice returns the QOM path of the VM's virtio-serial device
// (x-query-virtio).
func serialDevice(ctx context.Context, q *qmp) (string, error) {
	r, err := q.run(ctx, "x-query-virtio", nil)
	if err != nil {
		return "", err
	}
	return serialDeviceOf(r)
}

// serialDeviceOf finds the one virtio-serial device in an x-query-virtio
// answer.
func serialDeviceOf(r json.RawMessage) (string, error) {
	var devs []struct {
		Name string `json:"name"`
		Path string `json:"path"`
	}
	if err := json.Unmarshal(r, &devs); err != nil {
		return "", fmt.Errorf("x-query-virtio: %w", err)
	}
	path := ""
	for _, d := range devs {
		if d.Name != "virtio-serial" {
			continue
		}
		if path != "" || d.Path == "" {
			return "", errors.New("x-query-virtio: not one virtio-serial device with a path")
		}
		path = d.Path
	}
	if path == "" {
		return "", errors.New("x-query-virtio: no virtio-serial device")
	}
	return path, nil
}

// controlSent returns the used index of the control queue from the guest
// of the virtio-serial device at path: how many control messages QEMU
// has taken from the guest, modulo 2^16.
func controlSent(ctx context.Context, q *qmp, path string) (uint16, error) {
	r, err := q.run(ctx, "x-query-virtio-queue-status", map[string]any{"path": path, "queue": serialControlOut})
	if err != nil {
		return 0, err
	}
	return usedIndexOf(r)
}

// usedIndexOf reads the used index from an x-query-virtio-queue-status
// answer.
func usedIndexOf(r json.RawMessage) (uint16, error) {
	var st struct {
		Used *uint16 `json:"used-idx"`
	}
	if err := json.Unmarshal(r, &st); err != nil || st.Used == nil {
		return 0, fmt.Errorf("x-query-virtio-queue-status: no used index in %.200q (%v)", r, err)
	}
	return *st.Used, nil
}

// isHandBack tells whether ev ends a hand-back begun at since: the
// agent's port reported open by an event stamped after the hang-up (the
// close came before it, or was folded into it).
func isHandBack(ev qmpReply, since time.Time) bool {
	open, ok := portEventAfter(ev, AgentPortID, since)
	return ok && open
}

// portEventAfter tells whether ev is a VSERPORT_CHANGE of the port id
// that QEMU stamped at or after t, and whether it reports the port open.
func portEventAfter(ev qmpReply, id string, t time.Time) (open, ok bool) {
	var d struct {
		ID   string `json:"id"`
		Open bool   `json:"open"`
	}
	if ev.Event != "VSERPORT_CHANGE" || json.Unmarshal(ev.Data, &d) != nil || d.ID != id || ev.stamp().Before(t.Truncate(time.Microsecond)) {
		return false, false
	}
	return d.Open, true
}
