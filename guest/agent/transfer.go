package agent

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/transfer"
)

// Transfer runs `vmgate-agent put|get …` (agentproto.PutArgv, GetArgv):
// the guest side of a file transfer, run as the request's user in its
// working directory. It returns the exit status: 0, 1 for a refused or
// failed transfer, 2 for a bad command line; the reason goes to stderr.
func Transfer(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "vmgate-agent: want put or get")
		return 2
	}
	op := args[0]
	fl := flag.NewFlagSet("vmgate-agent "+op, flag.ContinueOnError)
	fl.SetOutput(stderr)
	var rules transfer.Rules
	fl.Int64Var(&rules.MaxBytes, "max-bytes", 0, "")
	fl.IntVar(&rules.MaxFiles, "max-files", 0, "")
	fl.StringVar(&rules.Top, "top", "", "")
	if err := fl.Parse(args[1:]); err != nil || fl.NArg() != 1 {
		fmt.Fprintf(stderr, "vmgate-agent %s: want flags and one path\n", op)
		return 2
	}
	target := fl.Arg(0)
	var err error
	switch op {
	case agentproto.TransferPut:
		rules.Dir = transfer.IntoGuest
		err = put(stdin, target, rules)
	case agentproto.TransferGet:
		rules.Dir = transfer.FromGuest
		err = get(stdout, target, rules)
	default:
		fmt.Fprintf(stderr, "vmgate-agent: unknown subcommand %q\n", op)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, err) // the host names the transfer

		return 1
	}
	return 0
}

func put(stdin io.Reader, dest string, rules transfer.Rules) error {
	if !transfer.ValidTop(rules.Top) {
		return fmt.Errorf("invalid --top %q", rules.Top)
	}
	parent, name, err := transfer.Resolve(dest, rules.Top)
	if err != nil {
		return err
	}
	_, err = transfer.Extract(stdin, parent, name, rules)
	return err
}

func get(stdout io.Writer, path string, rules transfer.Rules) error {
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return errors.New("no such file or directory")
	} else if err != nil {
		return err
	}
	_, err := transfer.Pack(stdout, path, rules)
	return err
}
