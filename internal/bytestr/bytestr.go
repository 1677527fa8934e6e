// Package bytestr is the JSON form of strings that may hold any bytes: a
// command's arguments and environment, which Linux takes as bytes, not as
// text. encoding/json writes a Go string's invalid UTF-8 as U+FFFD, so
// `printf %s "$(printf '\377')"` would reach the guest as another
// command, and be audited as one. A [List] keeps every byte:
//
//	["printf", "%s", {"b64": "/w=="}]
//
// An element that is valid UTF-8 is a JSON string, exactly as encoding/json
// writes a []string (so a list of text reads and writes as it always did);
// any other element is an object with one key, "b64", whose value is the
// standard base64 encoding (RFC 4648 §4, with padding) of its bytes. A
// decoder takes either form for any element, and refuses base64 that is not
// in that canonical form (so one list has one reading) and objects with
// other keys.
//
// The local API's exec request (gateway/wire) and the audit record
// (gateway/audit) use it; one home keeps the two forms equal.
//
// Threat model: the bytes come from API clients and are decoded by the
// daemon; the decoder allocates no more than its input's length and keeps
// no state. Bounding the input is the caller's (wire.MaxRequestBody, the
// audit's line limit).
package bytestr

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// List is a list of strings that may hold any bytes, with the JSON form
// of the package doc. A nil List is JSON null, as a nil []string is.
type List []string

// B64Key is the key of an element's base64 form.
const B64Key = "b64"

// element is the base64 form of one element.
type element struct {
	B64 string `json:"b64"`
}

// MarshalJSON writes l in the package's form: text as encoding/json writes
// it (HTML characters are escaped or not as the caller's encoder says),
// anything else as {"b64": …}.
func (l List) MarshalJSON() ([]byte, error) {
	if l == nil {
		return []byte("null"), nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	// The caller's encoder escapes <, > and & in what this returns when it
	// is set to; left unescaped here, they stay so when it is not.
	enc.SetEscapeHTML(false)
	buf.WriteByte('[')
	for i, s := range l {
		if i > 0 {
			buf.WriteByte(',')
		}
		var v any = s
		if !utf8.ValidString(s) {
			v = element{B64: base64.StdEncoding.EncodeToString([]byte(s))}
		}
		if err := enc.Encode(v); err != nil {
			return nil, err
		}
		buf.Truncate(buf.Len() - 1) // Encode's newline
	}
	buf.WriteByte(']')
	return buf.Bytes(), nil
}

// UnmarshalJSON reads l from null, or an array whose elements are strings
// or {"b64": "…"} objects. An error names the element (from 0).
func (l *List) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return errors.New("not a list of strings or {\"b64\": …} objects")
	}
	if raw == nil {
		*l = nil
		return nil
	}
	out := make(List, len(raw))
	for i, r := range raw {
		s, err := decode(r)
		if err != nil {
			return fmt.Errorf("element %d: %w", i, err)
		}
		out[i] = s
	}
	*l = out
	return nil
}

// decode reads one element: a JSON string, or a {"b64": "…"} object.
func decode(r json.RawMessage) (string, error) {
	r = bytes.TrimLeft(r, " \t\r\n")
	if len(r) > 0 && r[0] == '"' {
		var s string
		if err := json.Unmarshal(r, &s); err != nil {
			return "", errors.New("not a JSON string")
		}
		return s, nil
	}
	enc, err := b64Value(r)
	if err != nil {
		return "", err
	}
	dec, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return "", fmt.Errorf("b64: %w", err)
	}
	// DecodeString skips line breaks and takes non-zero padding bits;
	// only the canonical form has one reading.
	if base64.StdEncoding.EncodeToString(dec) != enc {
		return "", errors.New("b64: not canonical standard base64 (RFC 4648 §4, padded, no line breaks)")
	}
	return string(dec), nil
}

// b64Value returns the value of an object {"b64": "…"}: one key, no
// other (a repeated key would read one way here and another elsewhere).
func b64Value(r json.RawMessage) (string, error) {
	bad := errors.New(`neither a string nor an object {"b64": "…"} with that one key`)
	dec := json.NewDecoder(bytes.NewReader(r))
	var toks [4]json.Token
	for i := range toks {
		t, err := dec.Token()
		if err != nil {
			return "", bad
		}
		toks[i] = t
	}
	key, _ := toks[1].(string)
	val, isStr := toks[2].(string)
	if toks[0] != json.Delim('{') || key != B64Key || !isStr || toks[3] != json.Delim('}') {
		return "", bad
	}
	if _, err := dec.Token(); err == nil {
		return "", bad
	}
	return val, nil
}
