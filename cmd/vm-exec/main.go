// Command vm-exec runs a command in a disposable VM through vmgated, with
// the command's own output streams and exit code. See README.md.
package main

import (
	"os"

	"github.com/vmgate/vmgate/internal/cli"
)

func main() { os.Exit(cli.VMExec(os.Args[1:])) }
