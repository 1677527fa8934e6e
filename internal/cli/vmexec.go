package cli

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/vmgate/vmgate/internal/exitcode"
)

// DefaultSocket is the gateway's socket; VMGATE_SOCKET overrides it.
const DefaultSocket = "/run/vmgate/vmgate.sock"

const vmexecUsage = `usage: vm-exec [--socket PATH] [--timeout D] [--] PROG ARGS…
Runs PROG in a fresh disposable VM through the vmgated gateway.
Exit status: the command's, 128+N for signal N, or
  201 denied by policy, 202 busy, 203 timed out, 204 gateway unreachable, 205 VM failure.
`

// VMExec runs the vm-exec command line and returns the process exit code.
func VMExec(args []string) int {
	fs := flag.NewFlagSet("vm-exec", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, vmexecUsage) }
	def := DefaultSocket
	if s := os.Getenv("VMGATE_SOCKET"); s != "" {
		def = s
	}
	socket := fs.String("socket", def, "gateway socket")
	_ = fs.Duration("timeout", 0, "command time limit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitcode.Usage
	}
	if fs.NArg() == 0 {
		fmt.Fprint(os.Stderr, vmexecUsage)
		return exitcode.Usage
	}
	c, err := net.DialTimeout("unix", *socket, 5*time.Second)
	if err != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: cannot reach the gateway at %s: %v\nIs vmgated running? (set VMGATE_SOCKET or --socket to use another socket)\n", *socket, err)
		return exitcode.Unreachable
	}
	c.Close()
	fmt.Fprintf(os.Stderr, "vm-exec: the gateway at %s does not speak the exec protocol this client needs (gateway protocol /v1 is not available in this build); use `vmgated debug run -- PROG ARGS…`\n", *socket)
	return exitcode.Internal
}
