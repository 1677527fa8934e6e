package guestnet

import (
	"bytes"
	"errors"
	"github.com/vmgate/vmgate/policy/netrule"
	"strings"
)

// ErrNeedMore means the bytes so far are a valid prefix: read more.
var ErrNeedMore = errors.New("need more data")

// MaxSniff bounds how much of a connection's start is read to find the
// name it claims.
const MaxSniff = 16 << 10

// Protocol of a connection's first bytes.
const (
	ProtoTLS   = "tls"
	ProtoHTTP  = "http"
	ProtoOther = "other"
)

// SniffName returns the name the first bytes of a guest connection claim:
// the SNI of a TLS ClientHello or the Host of an HTTP/1 request (port
// removed, lower case). proto says which; for other protocols name is "".
// ErrNeedMore asks for more bytes (up to MaxSniff); other errors mean the
// start is malformed for the protocol it looks like.
func SniffName(b []byte) (name, proto string, err error) {
	if len(b) == 0 {
		return "", "", ErrNeedMore
	}
	if b[0] == 0x16 { // TLS handshake record
		n, err := clientHelloSNI(b)
		return n, ProtoTLS, err
	}
	if looksHTTP(b) {
		n, err := httpHost(b)
		return n, ProtoHTTP, err
	}
	return "", ProtoOther, nil
}

var httpMethods = []string{"GET ", "HEAD ", "POST ", "PUT ", "DELETE ", "OPTIONS ", "PATCH ", "CONNECT ", "TRACE "}

func looksHTTP(b []byte) bool {
	for _, m := range httpMethods {
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

// httpHost finds the Host header of the request head in b.
func httpHost(b []byte) (string, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= MaxSniff {
			return "", errors.New("http: request head too long")
		}
		return "", ErrNeedMore
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	if parts := strings.Fields(lines[0]); len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") {
		return "", errors.New("http: malformed request line")
	}
	host, found := "", 0
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			return "", errors.New("http: malformed header line")
		}
		if strings.EqualFold(strings.TrimSpace(k), "host") {
			found++
			host = strings.TrimSpace(v)
		}
	}
	if found != 1 {
		return "", errors.New("http: want exactly one Host header")
	}
	if h, _, ok := strings.Cut(host, ":"); ok && !strings.HasPrefix(host, "[") {
		host = h
	}
	name := netrule.NormalizeName(host)
	if name == "" {
		return "", errors.New("http: Host is not a DNS name")
	}
	return name, nil
}

// clientHelloSNI returns the host_name of the server_name extension of the
// TLS ClientHello at the start of b ("" when it has none).
func clientHelloSNI(b []byte) (string, error) {
	if len(b) < 5 {
		return "", ErrNeedMore
	}
	recLen := int(b[3])<<8 | int(b[4])
	if b[1] != 3 || recLen == 0 || recLen > 1<<14 {
		return "", errors.New("tls: bad record header")
	}
	if len(b) < 5+recLen {
		return "", ErrNeedMore
	}
	// The ClientHello must fit the first record (it does for every common
	// client; a split hello is refused rather than reassembled).
	r := reader{b: b[5 : 5+recLen]}
	if typ := r.u8(); typ != 1 {
		return "", errors.New("tls: not a ClientHello")
	}
	hl := r.u24()
	if hl > r.left() {
		return "", errors.New("tls: ClientHello split across records")
	}
	r.b = r.b[:r.off+hl]
	r.skip(2 + 32) // version, random
	r.skip(r.u8()) // session id
	r.skip(r.u16())
	r.skip(r.u8()) // cipher suites, compression methods
	if r.err != nil {
		return "", errors.New("tls: truncated ClientHello")
	}
	if r.left() == 0 {
		return "", nil // no extensions
	}
	ext := reader{b: r.bytes(r.u16())}
	if r.err != nil {
		return "", errors.New("tls: truncated extensions")
	}
	name, seen := "", false
	for ext.left() > 0 && ext.err == nil {
		typ, data := ext.u16(), ext.bytes(ext.u16())
		if ext.err != nil || typ != 0 {
			continue
		}
		if seen {
			return "", errors.New("tls: two server_name extensions")
		}
		seen = true
		sn := reader{b: data}
		list := reader{b: sn.bytes(sn.u16())}
		for list.left() > 0 && list.err == nil {
			kind, host := list.u8(), list.bytes(list.u16())
			if list.err == nil && kind == 0 {
				if name != "" {
					return "", errors.New("tls: two host names")
				}
				if name = netrule.NormalizeName(string(host)); name == "" {
					return "", errors.New("tls: server name is not a DNS name")
				}
			}
		}
		if sn.err != nil || list.err != nil {
			return "", errors.New("tls: malformed server_name")
		}
	}
	if ext.err != nil {
		return "", errors.New("tls: malformed extensions")
	}
	return name, nil
}

// reader reads big-endian fields, remembering the first overrun.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) bytes(n int) []byte {
	if r.err != nil || n < 0 || n > r.left() {
		r.err = errors.New("short")
		return nil
	}
	v := r.b[r.off : r.off+n]
	r.off += n
	return v
}

func (r *reader) skip(n int) { r.bytes(n) }

func (r *reader) u8() int {
	v := r.bytes(1)
	if v == nil {
		return 0
	}
	return int(v[0])
}

func (r *reader) u16() int {
	v := r.bytes(2)
	if v == nil {
		return 0
	}
	return int(v[0])<<8 | int(v[1])
}

func (r *reader) u24() int {
	v := r.bytes(3)
	if v == nil {
		return 0
	}
	return int(v[0])<<16 | int(v[1])<<8 | int(v[2])
}
