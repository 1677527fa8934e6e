package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
)

// policyReport is `vmgated policy check --json`.
type policyReport struct {
	File     string                `json:"file"`
	Valid    bool                  `json:"valid"`
	Error    string                `json:"error,omitempty"`
	Seccomp  string                `json:"seccomp,omitempty"`
	Cgroups  string                `json:"cgroups,omitempty"`
	Profiles []policy.ProfileImage `json:"profiles,omitempty"`
	Shapes   []policy.Shape        `json:"shapes,omitempty"`
	Explain  string                `json:"explain,omitempty"`
}

func policyCheck(fs *pflag.FlagSet) runFunc {
	asJSON := fs.Bool("json", false, "print the result as JSON (an invalid policy too, with exit status 1)")
	return func(_ context.Context, args []string) error {
		p, err := policy.Load(args[0])
		if !*asJSON {
			if err != nil {
				return err
			}
			fmt.Printf("%s: valid\n\n%s", args[0], p.Explain())
			return nil
		}
		rep := policyReport{File: args[0], Valid: err == nil}
		if err != nil {
			rep.Error = err.Error()
		} else {
			rep.Seccomp, rep.Cgroups, rep.Profiles, rep.Shapes, rep.Explain = p.Seccomp(), p.Cgroups(), p.Images(), p.Shapes(), p.Explain()
		}
		if jerr := json.NewEncoder(os.Stdout).Encode(rep); jerr != nil {
			return jerr
		}
		if err != nil {
			return exitWith(1, nil)
		}
		return nil
	}
}

// auditReport is one file of `vmgated audit verify --json`.
type auditReport struct {
	File          string    `json:"file"`
	Intact        bool      `json:"intact"`
	Error         string    `json:"error,omitempty"`
	Records       int       `json:"records"`
	FirstSeq      uint64    `json:"first_seq"`
	LastSeq       uint64    `json:"last_seq"`
	FirstTime     time.Time `json:"first_time"`
	LastTime      time.Time `json:"last_time"`
	Head          string    `json:"head"`
	ContinuesSeq  uint64    `json:"continues_seq,omitempty"`
	ContinuesHead string    `json:"continues_head,omitempty"`
	// Predecessor is the file the first record names as the one it
	// continues; PredecessorMissing says it is not there.
	Predecessor        string `json:"predecessor,omitempty"`
	PredecessorMissing bool   `json:"predecessor_missing,omitempty"`
	BrokenLine         int    `json:"broken_line,omitempty"`
	// Checkpoints, the last one's seq, the records after it and the keys
	// that signed them (fingerprints).
	Checkpoints       int      `json:"checkpoints"`
	LastCheckpointSeq uint64   `json:"last_checkpoint_seq,omitempty"`
	Unsigned          int      `json:"unsigned"`
	Keys              []string `json:"keys,omitempty"`
	KeysPinned        bool     `json:"keys_pinned"`
}

func auditVerify(fs *pflag.FlagSet) runFunc {
	asJSON := fs.Bool("json", false, "print one result per file as JSON (a broken chain too, with exit status 1)")
	var keyFiles []string
	fs.StringArrayVar(&keyFiles, "key", nil, "accept only checkpoints signed by public key `PUB` (vmgated receipt key prints it; repeatable), and require one")
	return func(_ context.Context, args []string) error {
		var o audit.VerifyOptions
		for _, f := range keyFiles {
			k, err := receipt.ReadPublicKey(f)
			if err != nil {
				return fmt.Errorf("%w: --key: %v", errUsage, err)
			}
			o.Keys = append(o.Keys, k)
		}
		reps, err := audit.VerifyFilesWith(o, args...)
		if *asJSON {
			out := []auditReport{}
			for i, r := range reps {
				a := auditReport{File: r.Path, Intact: err == nil || i < len(reps)-1, Records: r.Lines, FirstSeq: r.FirstSeq, LastSeq: r.LastSeq,
					FirstTime: r.FirstTime, LastTime: r.LastTime, Head: r.Head, ContinuesSeq: r.ContinuesSeq, ContinuesHead: r.ContinuesHead, BrokenLine: r.BrokenLine,
					PredecessorMissing: r.PredecessorMissing,
					Checkpoints:        r.Checkpoints, LastCheckpointSeq: r.LastCheckpointSeq, Unsigned: r.Unsigned, KeysPinned: len(o.Keys) > 0}
				if r.Predecessor != nil {
					a.Predecessor = r.Predecessor.File
				}
				for _, k := range r.Keys {
					a.Keys = append(a.Keys, k.Key)
				}
				if err != nil && i == len(reps)-1 {
					a.Error = err.Error()
				}
				out = append(out, a)
			}
			if jerr := json.NewEncoder(os.Stdout).Encode(out); jerr != nil {
				return jerr
			}
			if err != nil {
				return exitWith(1, nil)
			}
			return nil
		}
		for _, r := range reps {
			if r.Lines == 0 {
				fmt.Printf("%s: empty\n", r.Path)
				continue
			}
			from := "starts the chain"
			if r.ContinuesSeq != 0 {
				from = fmt.Sprintf("continues seq %d", r.ContinuesSeq)
				if r.Predecessor != nil && r.Predecessor.File != "" {
					from += " of " + r.Predecessor.File
				}
				if r.PredecessorMissing {
					from += ", which is missing (removed by retention, or erased)"
				}
			}
			fmt.Printf("%s: %d records, seq %d..%d, %s .. %s, %s, chain intact (head %s)\n", r.Path, r.Lines, r.FirstSeq, r.LastSeq,
				r.FirstTime.Format(time.RFC3339), r.LastTime.Format(time.RFC3339), from, r.Head)
			fmt.Printf("  %s\n", checkpointLine(r.Report, len(o.Keys) > 0))
		}
		return err
	}
}

// checkpointLine says what a file's checkpoints cover.
func checkpointLine(r audit.Report, pinned bool) string {
	if r.Checkpoints == 0 {
		return fmt.Sprintf("no signed checkpoint: none of its %d records is signed", r.Unsigned)
	}
	var keys []string
	for _, k := range r.Keys {
		keys = append(keys, fmt.Sprintf("%s (%d, seq %d..%d)", k.Key, k.Checkpoints, k.FirstSeq, k.LastSeq))
	}
	s := fmt.Sprintf("%d checkpoints signed by %s, the last at seq %d", r.Checkpoints, strings.Join(keys, ", "), r.LastCheckpointSeq)
	if r.Unsigned > 0 {
		s += fmt.Sprintf("; %d records after it are not signed yet", r.Unsigned)
	}
	if !pinned {
		s += "; keys not pinned: pass --key to check whose they are"
	}
	return s
}

func auditRotate(fs *pflag.FlagSet) runFunc {
	socket := fs.String("socket", "", "gateway socket (default $VMGATE_SOCKET, else "+wire.DefaultSocket+")")
	return func(ctx context.Context, _ []string) error {
		out, err := client.New(*socket).RotateAudit(ctx)
		if err != nil {
			return err
		}
		fmt.Printf("audit log moved to %v; the new file continues at seq %v (head %v)\n", out.RotatedTo, out.Seq, out.Head)
		return nil
	}
}

const statusLong = `Shows the daemon's load, its audit log's health, the running commands (VM, profile,
caller, start kind, age) and sessions (owner, idle time, expiry) of the caller, or of every
caller when the caller's profile has admin = true, and the pools of restored VMs.`

func status(fs *pflag.FlagSet) runFunc {
	socket := fs.String("socket", "", "gateway socket (default $VMGATE_SOCKET, else "+wire.DefaultSocket+")")
	asJSON := fs.Bool("json", false, "print the status as JSON")
	return func(ctx context.Context, _ []string) error {
		st, err := client.New(*socket).Status(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(os.Stdout).Encode(st)
		}
		return client.WriteStatus(os.Stdout, st, time.Now())
	}
}
