package gateway

import (
	"errors"

	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/vm"
)

// What the exec core turns a request away for. Every error it returns
// before a command's outcome is a *RequestError of one of these kinds
// (errors.Is); each front door reports a kind as the table wire.Kinds
// says: the local API with its HTTP status, the SSH front door with its
// exit status.
var (
	ErrBadRequest       = wire.KindBadRequest
	ErrDenied           = wire.KindDenied
	ErrBusy             = wire.KindBusy
	ErrSessionBusy      = wire.KindSessionBusy
	ErrAuditUnavailable = wire.KindAudit
	ErrVMFailed         = wire.KindVM
	ErrShutdown         = wire.KindShutdown
)

// RequestError is one request turned away: why (Kind), what the caller is
// told, and the request's ids.
type RequestError struct {
	Kind      *wire.Kind
	Msg       string
	RequestID string
	Profile   string
	Rule      string
	// Receipt is the signed receipt of a request that asked for one.
	Receipt []byte
	// FileError names a file operation's refusal by the guest.
	FileError string
}

func (e *RequestError) Error() string { return e.Msg }
func (e *RequestError) Unwrap() error { return e.Kind }

// Wire is the error as the protocol carries it.
func (e *RequestError) Wire() wire.Error {
	return wire.Error{Code: e.Kind.Code, Error: e.Msg, RequestID: e.RequestID, Profile: e.Profile, Rule: e.Rule, Receipt: e.Receipt, FileError: e.FileError}
}

// requestError is err as a *RequestError: itself, or of kind ErrVMFailed
// with the message a client may read (clientMessage).
func requestError(err error, q *request) *RequestError {
	var re *RequestError
	if errors.As(err, &re) {
		if re.RequestID == "" && q != nil {
			re.RequestID, re.Profile = q.reqID, q.verdict.Profile
		}
		return re
	}
	re = &RequestError{Kind: ErrVMFailed, Msg: clientMessage(err)}
	if q != nil {
		re.RequestID, re.Profile = q.reqID, q.verdict.Profile
	}
	return re
}

// clientMessage is err as a client reads it: a failed VM's QEMU log and
// console tail (written by the guest) stay in the daemon's log and the
// audit record (vm.Details); the client is told where they are.
func clientMessage(err error) string {
	if vm.Diagnostics(err) != "" {
		return err.Error() + " (QEMU's and the guest console's last lines are in vmgated's log)"
	}
	return err.Error()
}
