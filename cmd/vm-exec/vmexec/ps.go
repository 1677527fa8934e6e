package vmexec

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

func psDoc(jsonOut *bool, socket *string) Doc {
	fs := subFlags("ps")
	fs.BoolVar(jsonOut, "json", false, "print the status as JSON")
	fs.StringVar(socket, "socket", "", "gateway socket `PATH` (default $VMGATE_SOCKET, else "+wire.DefaultSocket+")")
	return Doc{
		Use:   "ps [--json]",
		Short: "Show the caller's running commands, sessions and the daemon's pools",
		Long: `Shows the daemon's load, the caller's running commands (VM, profile, start kind, age)
and sessions (idle time, expiry), and the pools; a caller whose profile has admin = true
sees every caller's. "vm-exec -- ps …" runs the guest's ps.`,
		Flags: fs,
	}
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
	if done, code := parseSub(psDoc(&jsonOut, &socket), args); done {
		return code
	}
	st, err := client.New(socket).Status(context.Background())
	if err != nil {
		return reportErr(err)
	}
	if jsonOut {
		err = json.NewEncoder(os.Stdout).Encode(st)
	} else {
		err = client.WriteStatus(os.Stdout, st, time.Now())
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec ps: %v\n", err)
		return wire.ExitInternal
	}
	return 0
}
