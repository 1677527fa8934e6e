package agentbench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/wire"
)

// Receipts: every command of every trial (inject, the agent's, the
// oracle's, the checks) asks for a signed receipt, and the run keeps each
// in OUT/receipts/SCENARIO-runN/, with the daemon's public key in
// OUT/receipt.pub and, for a run's own daemon, its audit log in
// OUT/audit.jsonl: `vmgated receipt verify OUT --key OUT/receipt.pub
// --audit OUT/audit.jsonl` checks a published run.

// ReceiptKeyFile is the daemon's public key in a run's output.
const ReceiptKeyFile = "receipt.pub"

// receiptKeeper writes one trial's receipts.
type receiptKeeper struct {
	dir string // absolute
	mu  sync.Mutex
	n   int
	r   *TrialResult // Receipts, ReceiptCount, ReceiptErrors
}

// newReceiptKeeper keeps the receipts of r's trial under out.
func newReceiptKeeper(out string, r *TrialResult) *receiptKeeper {
	r.Receipts = filepath.Join("receipts", fmt.Sprintf("%s-run%d", r.Scenario, r.Run))
	return &receiptKeeper{dir: filepath.Join(out, r.Receipts), r: r}
}

// exec keeps the receipt of a client.Exec (what a script ran): the
// result's, or the refusal's. A receipt the client refused is counted,
// and its error is not the command's: exec returns err without it.
func (k *receiptKeeper) exec(what string, res *wire.Result, err error) error {
	var re *client.ReceiptError
	if res != nil && errors.As(err, &re) && err == error(re) {
		k.refused(re)
		return nil
	}
	switch {
	case err == nil:
		k.write(what, res.RequestID, res.Receipt)
	case errors.As(err, &re):
		k.refused(re)
	default:
		k.write(what, client.RequestIDOf(err), client.ReceiptOf(err))
	}
	return err
}

// shell keeps the receipt of an exec_shell_command call.
func (k *receiptKeeper) shell(o shelltool.Outcome) shelltool.Outcome {
	if o.ReceiptErr != nil {
		var re *client.ReceiptError
		if errors.As(o.ReceiptErr, &re) {
			k.refused(re)
		}
		return o
	}
	k.write("shell", o.RequestID, o.Receipt)
	return o
}

func (k *receiptKeeper) refused(re *client.ReceiptError) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.r.ReceiptErrors = append(k.r.ReceiptErrors, re.Error())
}

// write saves doc as NNN-WHAT-REQUESTID.receipt; a request refused
// before its decision was recorded has none, and nothing is written.
func (k *receiptKeeper) write(what, id string, doc json.RawMessage) {
	if len(doc) == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.n++
	name := fmt.Sprintf("%03d-%s-%s.receipt", k.n, what, id)
	err := os.MkdirAll(k.dir, 0o755)
	if err == nil {
		err = os.WriteFile(filepath.Join(k.dir, name), append(append([]byte(nil), doc...), '\n'), 0o644)
	}
	if err != nil {
		k.r.ReceiptErrors = append(k.r.ReceiptErrors, fmt.Sprintf("%s: %v", name, err))
		return
	}
	k.r.ReceiptCount++
}

// saveReceiptKey writes the daemon's public key (from its status) into
// the run's output, for receipt verify --key.
func saveReceiptKey(ctx context.Context, c *client.Client, out string) error {
	st, err := c.Status(ctx)
	if err != nil {
		return fmt.Errorf("receipt key: %w", err)
	}
	if st.ReceiptPublicKey == "" {
		return errors.New("receipt key: the daemon reports none (an older vmgated?)")
	}
	return os.WriteFile(filepath.Join(out, ReceiptKeyFile), []byte(st.ReceiptPublicKey), 0o644)
}
