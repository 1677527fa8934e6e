package gateway

import (
	"errors"

	"github.com/vmgate/vmgate/gateway/wire"
)

// What the exec core turns a request away for. Every error it returns
// before a command's outcome is a *RequestError wrapping one of these
// (errors.Is); each front door maps them: the local API to an HTTP status
// (httpStatus), the SSH front door to an exit status (wire.Error.ExitCode).
var (
	ErrBadRequest       = errors.New("bad request")
	ErrDenied           = errors.New("denied by policy")
	ErrBusy             = errors.New("busy")
	ErrSessionBusy      = errors.New("session busy")
	ErrAuditUnavailable = errors.New("audit log unavailable")
	ErrVMFailed         = errors.New("vm failed")
	ErrShutdown         = errors.New("vmgated is shutting down")
)

// RequestError is one request turned away: why (Kind), what the caller is
// told, and the request's ids.
type RequestError struct {
	Kind      error
	Msg       string
	RequestID string
	Profile   string
	Rule      string
}

func (e *RequestError) Error() string { return e.Msg }
func (e *RequestError) Unwrap() error { return e.Kind }

// codes are the protocol's error codes of the kinds.
var codes = map[error]string{
	ErrBadRequest: wire.CodeBadRequest, ErrDenied: wire.CodeDenied, ErrBusy: wire.CodeBusy, ErrSessionBusy: wire.CodeBusy,
	ErrAuditUnavailable: wire.CodeAudit, ErrVMFailed: wire.CodeVM, ErrShutdown: wire.CodeShutdown,
}

// Wire is the error as the protocol carries it.
func (e *RequestError) Wire() wire.Error {
	code, ok := codes[e.Kind]
	if !ok {
		code = wire.CodeInternal
	}
	return wire.Error{Code: code, Error: e.Msg, RequestID: e.RequestID, Profile: e.Profile, Rule: e.Rule}
}

// requestError is err as a *RequestError: itself, or of kind ErrVMFailed.
func requestError(err error, st *execState) *RequestError {
	var re *RequestError
	if errors.As(err, &re) {
		if re.RequestID == "" && st != nil {
			re.RequestID, re.Profile = st.reqID, st.verdict.Profile
		}
		return re
	}
	re = &RequestError{Kind: ErrVMFailed, Msg: err.Error()}
	if st != nil {
		re.RequestID, re.Profile = st.reqID, st.verdict.Profile
	}
	return re
}
