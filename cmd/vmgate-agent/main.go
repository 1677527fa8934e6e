// Command vmgate-agent is the guest side of vmgate: a static binary that is
// both the initramfs's /init (when it runs as PID 1) and the guest agent
// daemon that serves the host on the vmgate.agent virtio-serial port.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/vmgate/vmgate/guest/agent"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/guest/boot"
)

// version is set by the build (-ldflags -X main.version=…).
var version = "dev"

func main() {
	if os.Getpid() == 1 {
		if filepath.Base(os.Args[0]) == agentproto.RootInitName {
			boot.RunRoot() // an imported root's init; never returns
		}
		boot.Run() // never returns
	}
	if len(os.Args) == 2 && os.Args[1] == agentproto.NetworkCommand {
		// An imported root's network, run by its own systemd.
		boot.ConfigureNetwork(os.Stderr)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == agentproto.FSCommand {
		// A file operation (agentproto.FSArgv), run as a command.
		os.Exit(agent.FS(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 {
		// A file transfer (vm-exec --put/--get), run as a command.
		os.Exit(agent.Transfer(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := agent.Main(ctx, log, version); err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "vmgate-agent: %v\n", err)
		os.Exit(1)
	}
}
