// Package netwire parses what a guest sends on its network, the bytes a
// hostile guest chooses: the name a connection claims (a TLS ClientHello's
// SNI, an HTTP/1 request's Host and target, SniffName), the HTTP heads the
// netstack forwards rebuilt from what it parsed (CopyRequests; with
// secrets' placeholders replaced or refused, CopyRequestsSecrets, and
// watched for in any stream, Guard), and the
// length-prefixed frames of QEMU's stream netdev (ReadFrame). It is pure:
// no network stack, no I/O but the streams it is given. The host's
// per-VM netstack (vm/netstack) enforces the operator's allowlist with it.
//
// Threat model: every byte is hostile. Parsers never panic, bound the
// bytes they look at (MaxSniff, MaxFrame) before they allocate, refuse
// what a lenient server could read differently (a bare LF, userinfo,
// duplicated or folded fields, ECH and ESNI on names), and answer "no"
// when unsure. Fuzzed: FuzzSniffName, FuzzCopyRequests,
// FuzzCopyRequestsSecrets, FuzzReadFrame.
package netwire

import (
	"errors"

	"github.com/vmgate/vmgate/internal/names"
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

// Claim is what the first bytes of a guest connection claim.
type Claim struct {
	Proto string // ProtoTLS, ProtoHTTP or ProtoOther
	// Name is the SNI of a TLS ClientHello or the Host of an HTTP/1
	// request (port removed, normalised); "" when there is none, or when
	// it is an address.
	Name string
	// Hidden names the ClientHello extension that carries a server name
	// the guard cannot read ("encrypted_client_hello" or the legacy
	// "encrypted_server_name"); Name is then only the outer, public name.
	Hidden string
}

// SniffName returns what the first bytes of a guest connection claim.
// ErrNeedMore asks for more bytes (up to MaxSniff); other errors mean the
// start is malformed for the protocol it looks like (Proto is set).
func SniffName(b []byte) (Claim, error) {
	if len(b) == 0 {
		return Claim{}, ErrNeedMore
	}
	if b[0] == 0x16 { // TLS handshake record
		n, hidden, err := clientHelloSNI(b)
		return Claim{Proto: ProtoTLS, Name: n, Hidden: hidden}, err
	}
	if looksHTTP(b) {
		h, _, err := parseRequestHead(b)
		return Claim{Proto: ProtoHTTP, Name: h.host}, err
	}
	return Claim{Proto: ProtoOther}, nil
}

// httpMethods are the methods the guard knows; a request with another is
// not HTTP to it.
var httpMethods = []string{"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE"}

// looksHTTP reports whether b starts, or could start, with a known
// method and a space.
func looksHTTP(b []byte) bool {
	for _, m := range httpMethods {
		m += " "
		n := min(len(b), len(m))
		if string(b[:n]) == m[:n] {
			return true
		}
	}
	return false
}

// TLS extensions that carry the server name encrypted: the name in the
// server_name extension beside them is only the public, outer one, and a
// server that has the key reaches the inner one (any site behind the same
// front, on a CDN that enables ECH).
const (
	extServerName           = 0x0000
	extEncryptedClientHello = 0xfe0d // draft-ietf-tls-esni, ECH
	extEncryptedServerName  = 0xffce // legacy ESNI, drafts 01 to 05
)

// clientHelloSNI returns the host_name of the server_name extension of the
// TLS ClientHello at the start of b ("" when it has none), and the name
// of an extension that hides the server name (ECH, ESNI) if it has one.
func clientHelloSNI(b []byte) (name, hidden string, err error) {
	// The handshake message may span several records, each of which may
	// span several segments: reassemble it from the records' payloads.
	var msg []byte
	for rest := b; ; {
		if len(rest) < 5 {
			return "", "", ErrNeedMore
		}
		recLen := int(rest[3])<<8 | int(rest[4])
		if rest[0] != 0x16 || rest[1] != 3 || recLen == 0 || recLen > 1<<14 {
			return "", "", errors.New("tls: bad record header")
		}
		if len(rest) < 5+recLen {
			return "", "", ErrNeedMore
		}
		msg = append(msg, rest[5:5+recLen]...)
		rest = rest[5+recLen:]
		if len(msg) >= 4 {
			if msg[0] != 1 {
				return "", "", errors.New("tls: not a ClientHello")
			}
			if hl := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]); len(msg) >= 4+hl {
				break
			} else if 4+hl > MaxSniff {
				return "", "", errors.New("tls: ClientHello too long")
			}
		}
	}
	r := reader{b: msg}
	r.u8()
	hl := r.u24()
	r.b = r.b[:r.off+hl]
	r.skip(2 + 32) // version, random
	r.skip(r.u8()) // session id
	r.skip(r.u16())
	r.skip(r.u8()) // cipher suites, compression methods
	if r.err != nil {
		return "", "", errors.New("tls: truncated ClientHello")
	}
	if r.left() == 0 {
		return "", "", nil // no extensions
	}
	ext := reader{b: r.bytes(r.u16())}
	if r.err != nil {
		return "", "", errors.New("tls: truncated extensions")
	}
	seen := false
	for ext.left() > 0 && ext.err == nil {
		typ, data := ext.u16(), ext.bytes(ext.u16())
		if ext.err != nil {
			break
		}
		switch typ {
		case extEncryptedClientHello:
			hidden = "encrypted_client_hello"
		case extEncryptedServerName:
			hidden = "encrypted_server_name"
		}
		if typ != extServerName {
			continue
		}
		if seen {
			return "", "", errors.New("tls: two server_name extensions")
		}
		seen = true
		sn := reader{b: data}
		list := reader{b: sn.bytes(sn.u16())}
		for list.left() > 0 && list.err == nil {
			kind, host := list.u8(), list.bytes(list.u16())
			if list.err == nil && kind == 0 {
				if name != "" {
					return "", "", errors.New("tls: two host names")
				}
				if name = names.Host(string(host)); name == "" {
					return "", "", errors.New("tls: server name is not a DNS name")
				}
			}
		}
		if sn.err != nil || list.err != nil {
			return "", "", errors.New("tls: malformed server_name")
		}
	}
	if ext.err != nil {
		return "", "", errors.New("tls: malformed extensions")
	}
	return name, hidden, nil
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
