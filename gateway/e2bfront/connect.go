package e2bfront

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// The sandbox side speaks the Connect protocol with its JSON codec
// (connectrpc.com's wire format, version 1), over HTTP/1.1:
//
//   - a unary call is a POST of one JSON message (Content-Type
//     application/json), answered by one JSON message, or by an error: an
//     HTTP status and {"code","message"};
//   - a server stream is a POST of one enveloped message (Content-Type
//     application/connect+json), answered by enveloped messages and one
//     end-of-stream envelope that holds the error, if any.
//
// An envelope is a flags byte, a 4-byte big-endian length and the
// message. This door compresses nothing and accepts nothing compressed.

// Connect error codes this door answers with.
const (
	codeCanceled           = "canceled"
	codeUnknown            = "unknown"
	codeInvalidArgument    = "invalid_argument"
	codeDeadlineExceeded   = "deadline_exceeded"
	codeNotFound           = "not_found"
	codeAlreadyExists      = "already_exists"
	codePermissionDenied   = "permission_denied"
	codeResourceExhausted  = "resource_exhausted"
	codeFailedPrecondition = "failed_precondition"
	codeUnimplemented      = "unimplemented"
	codeInternal           = "internal"
	codeUnavailable        = "unavailable"
	codeUnauthenticated    = "unauthenticated"
)

// codeStatus is the HTTP status of a unary call's error code (the
// Connect protocol's table).
var codeStatus = map[string]int{
	codeCanceled:           499,
	codeUnknown:            http.StatusInternalServerError,
	codeInvalidArgument:    http.StatusBadRequest,
	codeDeadlineExceeded:   http.StatusGatewayTimeout,
	codeNotFound:           http.StatusNotFound,
	codeAlreadyExists:      http.StatusConflict,
	codePermissionDenied:   http.StatusForbidden,
	codeResourceExhausted:  http.StatusTooManyRequests,
	codeFailedPrecondition: http.StatusBadRequest,
	codeUnimplemented:      http.StatusNotImplemented,
	codeInternal:           http.StatusInternalServerError,
	codeUnavailable:        http.StatusServiceUnavailable,
	codeUnauthenticated:    http.StatusUnauthorized,
}

// rpcError is a Connect error.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message,omitempty"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

func rpcErr(code, format string, args ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// asRPC returns err as a Connect error (unknown if it is none).
func asRPC(err error) *rpcError {
	var re *rpcError
	if errors.As(err, &re) {
		return re
	}
	return &rpcError{Code: codeUnknown, Message: err.Error()}
}

// Envelope flags.
const (
	flagCompressed = 0x01
	flagEndStream  = 0x02
)

// maxEnvelope bounds one enveloped request message.
const maxEnvelope = 1 << 20

// readEnvelope reads the one message of a streaming request into v.
func readEnvelope(r io.Reader, v any) error {
	var head [5]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return rpcErr(codeInvalidArgument, "stream request: no envelope: %v", err)
	}
	flags, n := head[0], binary.BigEndian.Uint32(head[1:])
	switch {
	case flags&flagCompressed != 0:
		return rpcErr(codeInvalidArgument, "stream request: compressed messages are not accepted")
	case flags != 0:
		return rpcErr(codeInvalidArgument, "stream request: unknown envelope flags %#x", flags)
	case n > maxEnvelope:
		return rpcErr(codeResourceExhausted, "stream request: a message of %d bytes, more than %d", n, maxEnvelope)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return rpcErr(codeInvalidArgument, "stream request: envelope of %d bytes cut short: %v", n, err)
	}
	return decodeMessage(body, v)
}

// decodeMessage parses a request message. Unknown fields are ignored, as
// protobuf's JSON reader does for a newer client.
func decodeMessage(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return rpcErr(codeInvalidArgument, "request message: %v", err)
	}
	return nil
}

// envelope frames one message.
func envelope(flags byte, msg []byte) []byte {
	out := make([]byte, 5+len(msg))
	out[0] = flags
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	copy(out[5:], msg)
	return out
}

// streamWriter writes a server stream's messages, each flushed.
type streamWriter struct {
	w     http.ResponseWriter
	ended bool
}

func startStream(w http.ResponseWriter) *streamWriter {
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	return &streamWriter{w: w}
}

// send writes one message; an error means the client is gone.
func (s *streamWriter) send(v any) error {
	msg, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := s.w.Write(envelope(0, msg)); err != nil {
		return err
	}
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// end writes the end-of-stream envelope, with err if it is not nil.
func (s *streamWriter) end(err error) {
	if s.ended {
		return
	}
	s.ended = true
	var tail struct {
		Error *rpcError `json:"error,omitempty"`
	}
	if err != nil {
		tail.Error = asRPC(err)
	}
	msg, _ := json.Marshal(tail)
	_, _ = s.w.Write(envelope(flagEndStream, msg))
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
}

// writeUnary answers a unary call with v, or with err's status and body.
func writeUnary(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		re := asRPC(err)
		status, ok := codeStatus[re.Code]
		if !ok {
			status = http.StatusInternalServerError
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(re)
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// isStreamRequest reports whether r is a Connect streaming request, and
// whether its content type is one this door reads at all.
func contentKind(r *http.Request) (stream, ok bool) {
	ct, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	switch strings.TrimSpace(strings.ToLower(ct)) {
	case "application/connect+json":
		return true, true
	case "application/json":
		return false, true
	}
	return false, false
}
