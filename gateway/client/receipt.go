package client

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/vmgate/vmgate/gateway/receipt"
	"github.com/vmgate/vmgate/gateway/wire"
)

// ReceiptError is a receipt the client refuses: the daemon sent none, or
// one it cannot read, or one that says other than what the client
// received. Exec returns it with the command's result (the command ran);
// the receipt is not kept.
type ReceiptError struct {
	RequestID string
	Err       error
}

func (e *ReceiptError) Error() string {
	return fmt.Sprintf("receipt of request %s refused: %v", e.RequestID, e.Err)
}

func (e *ReceiptError) Unwrap() error { return e.Err }

// receiptCheck is the client's own record of a request's streams.
type receiptCheck struct {
	stdout, stderr *receipt.Hasher
	stdin          *receipt.SentReader
}

// watchStreams wraps sio's streams to count and hash what passes.
func watchStreams(sio *ExecIO) *receiptCheck {
	rc := &receiptCheck{stdout: &receipt.Hasher{W: sio.Stdout}, stderr: &receipt.Hasher{W: sio.Stderr}}
	sio.Stdout, sio.Stderr = rc.stdout, rc.stderr
	if sio.Stdin != nil {
		rc.stdin = &receipt.SentReader{R: sio.Stdin}
		sio.Stdin = rc.stdin
	}
	return rc
}

// check checks the receipt that came with res or err. A result whose
// receipt fails comes back with a *ReceiptError and without the receipt;
// a refusal or failure whose receipt fails comes back with its receipt
// removed and the *ReceiptError joined to it.
func (rc *receiptCheck) check(res *wire.Result, err error, note func(string)) (*wire.Result, error) {
	r := receipt.Received{Stdout: rc.stdout.Stream(), Stderr: rc.stderr.Stream()}
	if rc.stdin != nil {
		r.StdinSent, r.StdinHead = rc.stdin.Sent()
	}
	var doc *json.RawMessage
	var ae *APIError
	var fe *ExecFailedError
	switch {
	case err == nil:
		doc, r.RequestID = &res.Receipt, res.RequestID
		r.Outcome = &receipt.Outcome{ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut}
	case errors.As(err, &ae):
		doc, r.RequestID = &ae.Body.Receipt, ae.Body.RequestID
	case errors.As(err, &fe):
		doc, r.RequestID = &fe.Body.Receipt, fe.Body.RequestID
	default:
		return res, err // no answer, no receipt
	}
	if len(*doc) == 0 {
		if err != nil {
			return res, err // a refusal before any decision was recorded
		}
		return res, &ReceiptError{RequestID: r.RequestID, Err: errors.New("the daemon sent no receipt")}
	}
	_, body, perr := receipt.Parse(*doc)
	if perr == nil {
		var notes []string
		notes, perr = body.Check(r)
		if note != nil {
			for _, n := range notes {
				note(n)
			}
		}
	}
	if perr == nil {
		return res, err
	}
	*doc = nil
	rerr := &ReceiptError{RequestID: r.RequestID, Err: perr}
	if err != nil {
		return res, errors.Join(err, rerr)
	}
	return res, rerr
}

// ReceiptOf returns the receipt carried by a refusal or failure of Exec
// (wire.Error.Receipt, already checked), or nil.
func ReceiptOf(err error) json.RawMessage {
	var ae *APIError
	var fe *ExecFailedError
	switch {
	case errors.As(err, &ae):
		return ae.Body.Receipt
	case errors.As(err, &fe):
		return fe.Body.Receipt
	}
	return nil
}

// RequestIDOf returns the request id a refusal or failure of Exec names,
// or "".
func RequestIDOf(err error) string {
	var ae *APIError
	var fe *ExecFailedError
	switch {
	case errors.As(err, &ae):
		return ae.Body.RequestID
	case errors.As(err, &fe):
		return fe.Body.RequestID
	}
	return ""
}
