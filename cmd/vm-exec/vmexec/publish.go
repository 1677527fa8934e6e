package vmexec

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// runPublish runs `vm-exec --session S --publish SPEC`: it listens on the
// host address as the caller (a busy address is an error naming it),
// hands the socket to vmgated, prints the address on stdout once the
// forward runs (JSON with --json), and runs until the session ends or it
// is stopped (Ctrl-C, SIGTERM), which ends the forward. A Unix socket's
// file is removed when it ends.
func runPublish(ctx context.Context, c *client.Client, o *vmexecOpts) int {
	h, err := o.pub.Listen()
	if err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: %v\n", err)
		return wire.ExitInternal
	}
	defer h.Close()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	show := func(p wire.Published) {
		if o.jsonOut {
			_ = json.NewEncoder(os.Stdout).Encode(p)
		} else if p.State == wire.PublishForwarding {
			fmt.Println(p.Host)
		}
	}
	end, err := c.Publish(ctx, o.session, int(o.pub.GuestPort), h, func(p wire.Published) {
		show(p)
		fmt.Fprintf(os.Stderr, "vm-exec: %s -> session %s, guest port %d (at most %d connections at once), until the session ends or this command is stopped\n",
			p.Host, p.Session, p.GuestPort, p.MaxConns)
	})
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(os.Stderr, "vm-exec: %s is no longer published (stopped)\n", h.Addr())
		return 0
	case err != nil:
		return reportErr(err)
	}
	show(*end)
	fmt.Fprintf(os.Stderr, "vm-exec: %s is no longer published: %s\n", h.Addr(), end.Why)
	return 0
}
