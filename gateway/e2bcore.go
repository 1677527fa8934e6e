package gateway

import (
	"context"
	"net"

	"github.com/vmgate/vmgate/policy"
)

// e2bCore is the daemon as the E2B door sees it (e2bfront.Core): the
// door's calls reach the local API as its keys' callers, so they pass the
// same decisions, audit and limits as every other request.
type e2bCore struct{ doorCore }

func (c e2bCore) Dial(ctx context.Context, id policy.Identity) (net.Conn, error) {
	return c.s.dialAs(ctx, id)
}
