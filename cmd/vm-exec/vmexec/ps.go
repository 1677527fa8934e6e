package vmexec

import (
	"context"
	"encoding/json"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

func psCommand(jsonOut *bool, socket *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ps [--json]",
		Short: "Show the caller's running commands, sessions and the daemon's pools",
		Long: `Shows the daemon's load, the caller's running commands (VM, profile, start kind, age)
and sessions (idle time, expiry), and the pools; a caller whose profile has admin = true
sees every caller's. "vm-exec -- ps …" runs the guest's ps.`,
		Args:                  cobra.NoArgs,
		DisableFlagsInUseLine: true,
		SilenceUsage:          true,
		SilenceErrors:         true,
	}
	cmd.Flags().BoolVar(jsonOut, "json", false, "print the status as JSON")
	cmd.Flags().StringVar(socket, "socket", "", "gateway socket `PATH` (default $VMGATE_SOCKET, else "+wire.DefaultSocket+")")
	return cmd
}

// isPS reports whether args are `ps` with only ps's own flags: then
// vm-exec shows the status, otherwise the guest's ps runs.
func isPS(args []string) bool {
	if len(args) == 0 || args[0] != "ps" {
		return false
	}
	for _, a := range args[1:] {
		switch a {
		case "--json", "-h", "--help":
		default:
			return false
		}
	}
	return true
}

// vmexecPS runs `vm-exec ps`.
func vmexecPS(args []string) int {
	var jsonOut bool
	var socket string
	cmd := psCommand(&jsonOut, &socket)
	cmd.SetArgs(args)
	cmd.SetOut(os.Stdout)
	code := 0
	cmd.RunE = func(*cobra.Command, []string) error {
		st, err := client.New(socket).Status(context.Background())
		if err != nil {
			code = reportErr(err)
			return nil
		}
		if jsonOut {
			return json.NewEncoder(os.Stdout).Encode(st)
		}
		return client.WriteStatus(os.Stdout, st, time.Now())
	}
	if c := execute(cmd, "vm-exec ps"); c != 0 {
		return c
	}
	return code
}
