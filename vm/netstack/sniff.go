package netstack

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/policy/netrule"
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

// requestHead is the part of an HTTP/1 request head the guard checks.
type requestHead struct {
	method, target string
	host           string // Host, normalised
	contentLength  int64  // -1: none
	chunked        bool
	upgrade        bool // an Upgrade header: the stream would stop being HTTP
}

// parseRequestHead parses the request head at the start of b (which must
// contain its blank line) and returns it with its length.
func parseRequestHead(b []byte) (requestHead, int, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if len(b) >= MaxSniff {
			return requestHead{}, 0, errors.New("http: request head too long")
		}
		return requestHead{}, 0, ErrNeedMore
	}
	h := requestHead{contentLength: -1}
	lines := strings.Split(string(b[:end]), "\r\n")
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "HTTP/1.") || !looksHTTP([]byte(lines[0])) {
		return requestHead{}, 0, errors.New("http: malformed request line")
	}
	h.method, h.target = parts[0], parts[1]
	host, found, te := "", 0, 0
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return requestHead{}, 0, errors.New("http: malformed header line")
		}
		v = strings.TrimSpace(v)
		switch strings.ToLower(k) {
		case "host":
			found++
			host = v
		case "content-length":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || h.contentLength >= 0 {
				return requestHead{}, 0, errors.New("http: bad or repeated Content-Length")
			}
			h.contentLength = n
		case "transfer-encoding":
			te++
			h.chunked = strings.EqualFold(v, "chunked")
		case "upgrade":
			h.upgrade = true
		}
	}
	switch {
	case found != 1:
		return requestHead{}, 0, errors.New("http: want exactly one Host header")
	case te > 1 || (te == 1 && !h.chunked):
		return requestHead{}, 0, errors.New("http: Transfer-Encoding other than chunked")
	case h.chunked && h.contentLength >= 0:
		return requestHead{}, 0, errors.New("http: both Content-Length and Transfer-Encoding")
	}
	if hh, _, ok := strings.Cut(host, ":"); ok && !strings.HasPrefix(host, "[") {
		host = hh
	}
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		h.host = "" // an address: it names nothing
	} else if h.host = netrule.NormalizeName(host); h.host == "" {
		return requestHead{}, 0, errors.New("http: Host is not a DNS name")
	}
	// An absolute-form target names the site itself: it must be the Host.
	if t, ok := strings.CutPrefix(strings.ToLower(h.target), "http://"); ok || strings.HasPrefix(strings.ToLower(h.target), "https://") {
		if !ok {
			t = strings.ToLower(h.target)[len("https://"):]
		}
		authority, _, _ := strings.Cut(t, "/")
		if ah, _, ok := strings.Cut(authority, ":"); ok {
			authority = ah
		}
		if netrule.NormalizeName(authority) != h.host {
			return requestHead{}, 0, errors.New("http: the request target names another site than Host")
		}
	}
	return h, end + 4, nil
}

// httpHost finds the Host of the request head at the start of b.
func httpHost(b []byte) (string, error) {
	h, _, err := parseRequestHead(b)
	return h.host, err
}

// clientHelloSNI returns the host_name of the server_name extension of the
// TLS ClientHello at the start of b ("" when it has none).
func clientHelloSNI(b []byte) (string, error) {
	// The handshake message may span several records, each of which may
	// span several segments: reassemble it from the records' payloads.
	var msg []byte
	for rest := b; ; {
		if len(rest) < 5 {
			return "", ErrNeedMore
		}
		recLen := int(rest[3])<<8 | int(rest[4])
		if rest[0] != 0x16 || rest[1] != 3 || recLen == 0 || recLen > 1<<14 {
			return "", errors.New("tls: bad record header")
		}
		if len(rest) < 5+recLen {
			return "", ErrNeedMore
		}
		msg = append(msg, rest[5:5+recLen]...)
		rest = rest[5+recLen:]
		if len(msg) >= 4 {
			if msg[0] != 1 {
				return "", errors.New("tls: not a ClientHello")
			}
			if hl := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3]); len(msg) >= 4+hl {
				break
			} else if 4+hl > MaxSniff {
				return "", errors.New("tls: ClientHello too long")
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

// copyRequests copies a guest's HTTP/1 requests to out one at a time,
// checking each head, so that every request on a kept-alive or
// pipelined connection names host, and none switches the connection to
// something that is not HTTP (Upgrade, CONNECT). Bodies are copied by
// their Content-Length or chunk by chunk. It returns why it stopped: ""
// at a clean end (the guest closed between requests), else the refusal
// or the error; the caller then closes the connection.
func copyRequests(out io.Writer, in *bufio.Reader, host string) string {
	for {
		head, err := readHead(in)
		if err != nil {
			if errors.Is(err, io.EOF) && len(head) == 0 {
				return ""
			}
			return "http: " + err.Error()
		}
		h, _, err := parseRequestHead(head)
		switch {
		case err != nil:
			return err.Error()
		case h.host != host:
			return fmt.Sprintf("http: a request on the connection names %q, not %q", h.host, host)
		case h.upgrade || h.method == "CONNECT":
			return "http: switching protocols (Upgrade, CONNECT) is not allowed on a port allowed by name"
		}
		if _, err := out.Write(head); err != nil {
			return "write: " + err.Error()
		}
		switch {
		case h.chunked:
			err = copyChunked(out, in)
		case h.contentLength > 0:
			_, err = io.CopyN(out, in, h.contentLength)
		}
		if err != nil {
			return "http body: " + err.Error()
		}
	}
}

// readHead reads one request head, up to and including its blank line
// (at most MaxSniff bytes).
func readHead(in *bufio.Reader) ([]byte, error) {
	var head []byte
	for {
		line, err := in.ReadSlice('\n')
		head = append(head, line...)
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				err = errors.New("header line too long")
			}
			return head, err
		}
		if len(head) > MaxSniff {
			return head, errors.New("request head too long")
		}
		if string(line) == "\r\n" {
			return head, nil
		}
	}
}

// copyChunked copies a chunked body (RFC 9112 7.1) with its trailers.
func copyChunked(out io.Writer, in *bufio.Reader) error {
	for {
		line, err := in.ReadSlice('\n')
		if err != nil {
			return err
		}
		if _, err := out.Write(line); err != nil {
			return err
		}
		sz, _, _ := strings.Cut(strings.TrimRight(string(line), "\r\n"), ";")
		n, err := strconv.ParseInt(strings.TrimSpace(sz), 16, 64)
		if err != nil || n < 0 {
			return errors.New("bad chunk size")
		}
		if n == 0 {
			// Trailers, then the blank line that ends the body.
			for {
				t, err := in.ReadSlice('\n')
				if err != nil {
					return err
				}
				if _, err := out.Write(t); err != nil {
					return err
				}
				if string(t) == "\r\n" {
					return nil
				}
			}
		}
		if _, err := io.CopyN(out, in, n); err != nil {
			return err
		}
		crlf := make([]byte, 2)
		if _, err := io.ReadFull(in, crlf); err != nil || string(crlf) != "\r\n" {
			return errors.New("chunk not followed by CRLF")
		}
		if _, err := out.Write(crlf); err != nil {
			return err
		}
	}
}
