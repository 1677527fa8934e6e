package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/client/shelltool"
)

func TestReceiptStore(t *testing.T) {
	var r receiptStore
	if _, _, ok := r.get(""); ok {
		t.Fatal("empty store returned a receipt")
	}
	r.keep(shelltool.Outcome{RequestID: "a"}) // no receipt: nothing kept
	r.keep(shelltool.Outcome{Receipt: json.RawMessage(`{}`)})
	if len(r.order) != 0 {
		t.Fatalf("kept %v", r.order)
	}
	for i := range maxReceipts + 3 {
		r.keep(shelltool.Outcome{RequestID: fmt.Sprintf("%x", i), Receipt: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))})
	}
	if len(r.order) != maxReceipts || len(r.byID) != maxReceipts {
		t.Fatalf("%d kept, %d indexed", len(r.order), len(r.byID))
	}
	if _, _, ok := r.get("0"); ok {
		t.Error("the oldest receipt outlived the bound")
	}
	id, sr, ok := r.get("")
	if !ok || id != fmt.Sprintf("%x", maxReceipts+2) || string(sr.doc) != fmt.Sprintf(`{"n":%d}`, maxReceipts+2) {
		t.Errorf("latest: %s %s %v", id, sr.doc, ok)
	}
}

func TestParseReceiptArgs(t *testing.T) {
	for _, c := range []struct {
		raw, id string
		bad     bool
	}{
		{``, "", false}, {`null`, "", false}, {`{}`, "", false}, {`{"request_id":""}`, "", false},
		{`{"request_id":"0123abcd"}`, "0123abcd", false},
		{`{"request_id":"../x"}`, "", true}, {`{"request_id":12}`, "", true}, {`[]`, "", true},
	} {
		id, err := parseReceiptArgs(json.RawMessage(c.raw))
		if id != c.id || (err != nil) != c.bad || (err != nil && !errors.Is(err, shelltool.ErrArgs)) {
			t.Errorf("%s: %q %v", c.raw, id, err)
		}
	}
}

// TestReceiptTool: the tool returns the receipt of a request by id, the
// latest without one, and says why it has none; an exec result names its
// request in _meta.
func TestReceiptTool(t *testing.T) {
	tc := connect(t, client.New(filepath.Join(t.TempDir(), "none.sock")), nil)
	if text, isErr := tc.call(t, ToolReceipt, nil); !isErr || !strings.Contains(text, "no command has run") {
		t.Fatalf("before any command: %q %v", text, isErr)
	}
	doc := `{"vmgate_receipt":1,"body":{"request_id":"aa"},"sig":"x"}`
	tc.srv.receipts.keep(shelltool.Outcome{RequestID: "aa", Receipt: json.RawMessage(doc)})
	tc.srv.receipts.keep(shelltool.Outcome{RequestID: "bb", ReceiptErr: errors.New("stdout differs")})
	for _, c := range []struct {
		args  map[string]any
		want  string
		isErr bool
	}{
		{map[string]any{"request_id": "aa"}, doc, false},
		{nil, "the receipt of request bb was refused: stdout differs", true},
		{map[string]any{"request_id": "cc"}, "no receipt of request cc here", true},
		{map[string]any{"request_id": "x y"}, "not a request id", true},
	} {
		text, isErr := tc.call(t, ToolReceipt, c.args)
		if isErr != c.isErr || !strings.Contains(text, c.want) {
			t.Errorf("%v: %q %v", c.args, text, isErr)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := tc.cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolReceipt, Arguments: map[string]any{"request_id": "aa"}})
	if err != nil || res.Meta[MetaRequestID] != "aa" {
		t.Fatalf("meta: %v %v", res.Meta, err)
	}
}
