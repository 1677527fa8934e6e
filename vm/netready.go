package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/vm/agentproto"
)

// ErrNetworkNotReady reports that a VM with a NIC did not get a usable
// network (address, default route, answering resolver) in time. The VM is
// not handed out: a command that needs the network would fail in ways
// that look like the network's policy (DNS errors, wget exit 4).
var ErrNetworkNotReady = errors.New("guest network not ready")

// DefaultNetworkTimeout bounds the wait for a VM's network (a cold boot's
// DHCP under TCG takes ~8 s after the agent answers).
const DefaultNetworkTimeout = 60 * time.Second

// replyMargin is how much longer than the agent's own limit the host waits
// for an answer before it gives the agent up.
const replyMargin = 5 * time.Second

// waitNetwork asks the agent to wait until the guest network is usable
// and checks its answer. A restored clone's network is up at once (its
// template saved it with its lease); a cold boot's comes up a few seconds
// after the agent.
func (v *VM) waitNetwork(ctx context.Context, timeout time.Duration) (*agentproto.NetReadyStatus, error) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return nil, fmt.Errorf("%w: no time left to wait for it", ErrNetworkNotReady)
	}
	b, _ := json.Marshal(agentproto.NetReady{TimeoutMS: max(timeout.Milliseconds(), 1)})
	ok, reply, err := v.boundedRequest(ctx, agentproto.NetReadyRequest, ssh.Marshal(agentproto.ExecPayload{JSON: string(b)}), timeout+replyMargin)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNetworkNotReady, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: the agent refused the readiness check", ErrNetworkNotReady)
	}
	var p agentproto.ExecPayload
	var st agentproto.NetReadyStatus
	if err := ssh.Unmarshal(reply, &p); err != nil {
		return nil, fmt.Errorf("%w: readiness reply: %w", ErrNetworkNotReady, err)
	}
	if err := json.Unmarshal([]byte(p.JSON), &st); err != nil {
		return nil, fmt.Errorf("%w: readiness reply: %w", ErrNetworkNotReady, err)
	}
	if !st.Ready {
		detail := st.Detail
		if len(detail) > 200 {
			detail = detail[:200]
		}
		return &st, fmt.Errorf("%w after %v: %s", ErrNetworkNotReady, time.Duration(st.WaitedMS)*time.Millisecond, detail)
	}
	return &st, nil
}

// boundedRequest sends a global request to the agent and waits at most
// limit (and while ctx lasts and QEMU runs) for its reply. An agent that
// does not answer in time loses its connection, which also ends the
// pending SendRequest; the VM is then unusable and the caller destroys it.
func (v *VM) boundedRequest(ctx context.Context, name string, payload []byte, limit time.Duration) (bool, []byte, error) {
	type reply struct {
		ok   bool
		data []byte
		err  error
	}
	done := make(chan reply, 1)
	go func() {
		ok, data, err := v.client.SendRequest(name, true, payload)
		done <- reply{ok, data, err}
	}()
	t := time.NewTimer(limit)
	defer t.Stop()
	var why error
	select {
	case r := <-done:
		return r.ok, r.data, r.err
	case <-t.C:
		why = fmt.Errorf("the agent did not answer %s within %v", name, limit)
	case <-ctx.Done():
		why = ctx.Err()
	case <-v.exited:
		why = v.died("while waiting for the agent")
	}
	_ = v.client.Close()
	<-done
	return false, nil, why
}
