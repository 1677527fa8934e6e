// Command vm-exec runs a command in a disposable VM through vmgated, with
// the command's own output streams and exit code. See README.md.
package main

import (
	"os"

	"github.com/vmgate/vmgate/cmd/vm-exec/vmexec"
)

func main() { os.Exit(vmexec.Run(os.Args[1:])) }
