package agentbench

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
)

// TestReceiptKeeper: a trial keeps the receipt of each command it ran,
// of a refusal too, counts the receipts the client refused (without
// turning them into the command's failure), and writes nothing for a
// request that never reached a decision.
func TestReceiptKeeper(t *testing.T) {
	out := t.TempDir()
	r := &TrialResult{Scenario: "sc", Run: 2}
	k := newReceiptKeeper(out, r)
	doc := json.RawMessage(`{"vmgate_receipt":1}`)
	if err := k.exec("script", &wire.Result{RequestID: "aa", Receipt: doc}, nil); err != nil {
		t.Fatal(err)
	}
	refusedReceipt := &client.ReceiptError{RequestID: "bb", Err: errors.New("stdout differs")}
	if err := k.exec("script", &wire.Result{RequestID: "bb"}, refusedReceipt); err != nil {
		t.Fatalf("a refused receipt failed the command: %v", err)
	}
	denied := &client.APIError{Status: 403, Body: wire.Error{Code: wire.CodeDenied, RequestID: "cc", Receipt: doc}}
	if err := k.exec("script", nil, denied); !errors.Is(err, client.ErrDenied) {
		t.Fatalf("denial: %v", err)
	}
	if err := k.exec("script", nil, &client.UnreachableError{Socket: "x", Err: errors.New("no")}); err == nil {
		t.Fatal("unreachable: no error")
	}
	k.shell(shelltool.Outcome{RequestID: "dd", Receipt: doc})
	k.shell(shelltool.Outcome{RequestID: "ee", ReceiptErr: &client.ReceiptError{RequestID: "ee", Err: errors.New("missing")}})

	if r.Receipts != filepath.Join("receipts", "sc-run2") || r.ReceiptCount != 3 || len(r.ReceiptErrors) != 2 {
		t.Fatalf("result: %q %d %q", r.Receipts, r.ReceiptCount, r.ReceiptErrors)
	}
	ents, _ := os.ReadDir(filepath.Join(out, r.Receipts))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "001-script-aa.receipt 002-script-cc.receipt 003-shell-dd.receipt" {
		t.Fatalf("files %v", names)
	}
}

// checkRunReceipts checks a finished run's receipts as a reader of the
// published run would: each under the key in the output, its record in
// the output's audit log, at its seq with its hash.
func checkRunReceipts(t *testing.T, out string, r TrialResult) {
	t.Helper()
	if r.ReceiptCount == 0 || len(r.ReceiptErrors) > 0 {
		t.Fatalf("receipts: %d kept, refused %q", r.ReceiptCount, r.ReceiptErrors)
	}
	pub, err := receipt.ReadPublicKey(filepath.Join(out, ReceiptKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	hashes := map[uint64]string{}
	if _, err := audit.VerifyFilesWith(audit.VerifyOptions{Keys: []ed25519.PublicKey{pub}, Visit: func(rec *audit.Record, h string) { hashes[rec.Seq] = h }},
		filepath.Join(out, "audit.jsonl")); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(out, r.Receipts, "*.receipt"))
	if len(files) != r.ReceiptCount {
		t.Fatalf("%d files, %d counted", len(files), r.ReceiptCount)
	}
	for _, f := range files {
		doc, _ := os.ReadFile(f)
		b, err := receipt.Verify(bytes.TrimSuffix(doc, []byte("\n")), pub)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if b.Audit == nil || hashes[b.Audit.Seq] != b.Audit.Hash {
			t.Errorf("%s: audit %+v not in the log", f, b.Audit)
		}
	}
}
