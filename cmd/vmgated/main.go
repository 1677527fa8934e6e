// Command vmgated is the vmgate daemon and admin tool: it builds guest
// images and runs commands in disposable VMs. See README.md.
package main

import (
	"os"

	"github.com/vmgate/vmgate/cmd/vmgated/cli"
	"github.com/vmgate/vmgate/internal/reexec"
)

func main() {
	reexec.MaybeRunChild()
	os.Exit(cli.Vmgated(os.Args[1:]))
}
