package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
)

// The receipt tool: every command an exec tool runs asks for a signed
// receipt (shelltool.Run), which the client checks against what it
// received; the server keeps the last maxReceipts of them by request id.
// Each exec tool's result names its request in _meta (MetaRequestID), and
// the receipt tool returns the receipt: the JSON document exactly as
// signed, which `vmgated receipt verify` checks.

// ToolReceipt is the receipt tool's name.
const ToolReceipt = "receipt"

// MetaRequestID is the _meta key of an exec tool result that names the
// command's request id.
const MetaRequestID = "vmgate/request_id"

// maxReceipts bounds the receipts the server keeps (a few hundred bytes
// to a few KiB each).
const maxReceipts = 256

// receiptStore keeps the latest receipts, or why one was refused, by
// request id.
type receiptStore struct {
	mu    sync.Mutex
	order []string
	byID  map[string]storedReceipt
}

type storedReceipt struct {
	doc json.RawMessage
	err error // the client refused the receipt that came
}

// keep records o's receipt (or its refusal) under its request id.
func (r *receiptStore) keep(o shelltool.Outcome) {
	if o.RequestID == "" || (o.Receipt == nil && o.ReceiptErr == nil) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[string]storedReceipt{}
	}
	if _, ok := r.byID[o.RequestID]; !ok {
		r.order = append(r.order, o.RequestID)
	}
	r.byID[o.RequestID] = storedReceipt{doc: o.Receipt, err: o.ReceiptErr}
	for len(r.order) > maxReceipts {
		delete(r.byID, r.order[0])
		r.order = r.order[1:]
	}
}

// get returns the receipt of request id, or of the latest request when
// id is empty.
func (r *receiptStore) get(id string) (string, storedReceipt, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id == "" {
		if len(r.order) == 0 {
			return "", storedReceipt{}, false
		}
		id = r.order[len(r.order)-1]
	}
	sr, ok := r.byID[id]
	return id, sr, ok
}

// withRequestID names o's request in the result's _meta.
func withRequestID(res *mcp.CallToolResult, o shelltool.Outcome) *mcp.CallToolResult {
	if o.RequestID != "" {
		res.Meta = mcp.Meta{MetaRequestID: o.RequestID}
	}
	return res
}

var requestIDRE = regexp.MustCompile(`^[0-9a-f]{1,64}$`)

// receiptArgs are the receipt tool's arguments, and its schema's source.
type receiptArgs struct {
	RequestID *string `json:"request_id,omitempty" jsonschema:"The command's request id (default: the latest command)"`
}

// parseReceiptArgs decodes the receipt tool's arguments: an optional
// request_id (hex, as the gateway makes them).
func parseReceiptArgs(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	var a receiptArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return "", fmt.Errorf("%w: want {\"request_id\": \"…\"}: %v", shelltool.ErrArgs, err)
	}
	if a.RequestID == nil || *a.RequestID == "" {
		return "", nil
	}
	if !requestIDRE.MatchString(*a.RequestID) {
		return "", fmt.Errorf("%w: \"request_id\" %q is not a request id (hex, as in a result's _meta %q)", shelltool.ErrArgs, *a.RequestID, MetaRequestID)
	}
	return *a.RequestID, nil
}

func (s *Server) addReceiptTool() {
	s.mcp.AddTool(&mcp.Tool{
		Name:        ToolReceipt,
		Annotations: annotations[ToolReceipt],
		Description: "Return the signed receipt of a command run by " + shelltool.Name + " or " + ToolSessionExec +
			" (by its request_id, found in the tool result's _meta \"" + MetaRequestID + "\"; the latest command's without one): " +
			"a JSON document, signed by the gateway, of what ran, in which image under which policy, what it printed and how it ended; " +
			"`vmgated receipt verify` checks it offline.",
		InputSchema: schemaFor[receiptArgs](nil),
	}, s.wrap(s.receipt))
}

func (s *Server) receipt(_ context.Context, req *mcp.CallToolRequest) *mcp.CallToolResult {
	id, err := parseReceiptArgs(req.Params.Arguments)
	if err != nil {
		return textResult(err.Error(), true)
	}
	id, sr, ok := s.receipts.get(id)
	switch {
	case !ok && id == "":
		return textResult("no command has run through this server yet", true)
	case !ok:
		return textResult(fmt.Sprintf("no receipt of request %s here: it did not run through this server, or is older than its last %d commands", id, maxReceipts), true)
	case sr.err != nil:
		return textResult(fmt.Sprintf("the receipt of request %s was refused: %v", id, sr.err), true)
	}
	return withRequestID(textResult(string(sr.doc), false), shelltool.Outcome{RequestID: id})
}
