package vm

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
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
	var st agentproto.NetReadyStatus
	if err := v.call(ctx, agentproto.CallNetReady, agentproto.NetReady{TimeoutMS: max(timeout.Milliseconds(), 1)}, &st, timeout+replyMargin); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNetworkNotReady, err)
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
