// Command mangen writes the man pages of vmgated and vm-exec from their
// command trees (the help texts are the reference): go run ./cmd/mangen
// -out DIR, as make man does.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/vmgate/vmgate/cmd/vm-exec/vmexec"
	"github.com/vmgate/vmgate/cmd/vmgated/cli"
)

func main() {
	out := flag.String("out", "man", "output directory")
	flag.Parse()
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "mangen: %v\n", err)
		os.Exit(1)
	}
	for _, c := range []*cobra.Command{cli.Command(), command(vmexec.Describe())} {
		c.DisableAutoGenTag = true
		hdr := &doc.GenManHeader{Title: c.Name(), Section: "1", Source: "vmgate", Manual: "vmgate manual"}
		if err := doc.GenManTree(c, hdr, *out); err != nil {
			fmt.Fprintf(os.Stderr, "mangen: %s: %v\n", c.Name(), err)
			os.Exit(1)
		}
	}
}

// command is a command tree, for the man pages only, of a command that
// parses its own command line (vm-exec: vmexec.Doc).
func command(d vmexec.Doc) *cobra.Command {
	c := &cobra.Command{Use: d.Use, Short: d.Short, Long: d.Long, DisableFlagsInUseLine: true, Run: func(*cobra.Command, []string) {}}
	if d.Flags != nil {
		c.Flags().AddFlagSet(d.Flags)
	}
	for _, sub := range d.Subcommands {
		c.AddCommand(command(sub))
	}
	return c
}
