package cli

import (
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/cmd/vm-exec/vmexec"
)

// TestReadmeFollowsHelp: README's command list is the help texts'
// summary; a command or vm-exec flag added without it fails here.
func TestReadmeFollowsHelp(t *testing.T) {
	b, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, s := range c.Commands() {
			switch {
			case s.Name() == "help" || s.Name() == "completion":
			case s.HasSubCommands():
				walk(s)
			case !strings.Contains(readme, s.UseLine()) || !strings.Contains(readme, s.Short):
				t.Errorf("README lacks %q with %q", s.UseLine(), s.Short)
			}
		}
	}
	walk(Command())
	vmexec.Describe().Flags.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(readme, "--"+f.Name) {
			t.Errorf("README lacks vm-exec --%s", f.Name)
		}
	})
}
