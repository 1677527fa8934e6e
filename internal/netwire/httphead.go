package netwire

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vmgate/vmgate/internal/names"
)

// HTTP/1 requests on a port allowed by name (RFC 9112, RFC 3986): the
// package doc says what they defend against.

// requestHead is one HTTP/1 request head as the guard parsed it: enough to
// check it and to write it again.
type requestHead struct {
	method, version string
	target          requestTarget
	fields          []field // in order; framing and Host values canonical
	host            string  // the name Host names, normalised; "" for an address
	contentLength   int64   // -1: none
	chunked         bool
	upgrade         bool // an Upgrade header: the stream would stop being HTTP
}

// field is one header field line: a token name as sent, and its value
// without the whitespace around it.
type field struct{ name, value string }

// authority is a host and an optional port, in canonical form.
type authority struct {
	host string // a normalised DNS name, an IPv4 address or a bracketed IPv6 address
	addr bool   // host is an address
	port string // decimal without leading zeros, "" for none
}

func (a authority) String() string {
	if a.port == "" {
		return a.host
	}
	return a.host + ":" + a.port
}

// The forms of a request target (RFC 9112 3.2).
const (
	originForm    = iota // /path?query
	absoluteForm         // http://host:port/path?query
	authorityForm        // host:port, for CONNECT
	asteriskForm         // *, for OPTIONS
)

type requestTarget struct {
	form   int
	scheme string    // absolute-form: "http" or "https"
	auth   authority // absolute-form and authority-form
	rest   string    // origin-form and absolute-form: path and query
}

func (t requestTarget) String() string {
	switch t.form {
	case asteriskForm:
		return "*"
	case authorityForm:
		return t.auth.String()
	case absoluteForm:
		return t.scheme + "://" + t.auth.String() + t.rest
	}
	return t.rest
}

// appendTo appends the head as the guard forwards it.
func (h requestHead) appendTo(b []byte) []byte {
	b = append(b, h.method...)
	b = append(b, ' ')
	b = append(b, h.target.String()...)
	b = append(b, ' ')
	b = append(b, h.version...)
	b = append(b, "\r\n"...)
	for _, f := range h.fields {
		b = f.appendTo(b)
	}
	return append(b, "\r\n"...)
}

func (f field) appendTo(b []byte) []byte {
	b = append(b, f.name...)
	b = append(b, ':')
	if f.value != "" {
		b = append(b, ' ')
		b = append(b, f.value...)
	}
	return append(b, "\r\n"...)
}

// checkHeadBytes refuses a CR or LF anywhere but in a CRLF pair, and
// every other control byte but HTAB. b is a head or a line, or when
// partial the start of one (it may then end in the CR of a CRLF to come).
func checkHeadBytes(b []byte, partial bool) error {
	for i, c := range b {
		switch {
		case c == '\r':
			if i+1 < len(b) && b[i+1] == '\n' || partial && i+1 == len(b) {
				continue
			}
			return errors.New("a CR not followed by LF")
		case c == '\n':
			if i == 0 || b[i-1] != '\r' {
				return errors.New("a bare LF (only CRLF ends a line)")
			}
		case c == '\t':
		case c < 0x20 || c == 0x7f:
			return fmt.Errorf("control byte %#02x", c)
		}
	}
	return nil
}

// parseRequestHead parses the request head at the start of b (which must
// contain its blank line) and returns it with its length.
func parseRequestHead(b []byte) (requestHead, int, error) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		if err := checkHeadBytes(b, true); err != nil {
			return requestHead{}, 0, fmt.Errorf("http: request head: %w", err)
		}
		if len(b) >= MaxSniff {
			return requestHead{}, 0, errors.New("http: request head too long")
		}
		return requestHead{}, 0, ErrNeedMore
	}
	if end+4 > MaxSniff {
		return requestHead{}, 0, errors.New("http: request head too long")
	}
	if err := checkHeadBytes(b[:end+4], false); err != nil {
		return requestHead{}, 0, fmt.Errorf("http: request head: %w", err)
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	h, err := parseRequestLine(lines[0])
	if err != nil {
		return requestHead{}, 0, err
	}
	var host authority
	hosts, te := 0, 0
	for _, l := range lines[1:] {
		f, err := parseField(l)
		if err != nil {
			return requestHead{}, 0, err
		}
		key := strings.ToLower(f.name)
		if k := strings.ReplaceAll(key, "_", "-"); k != key && framing(k) {
			return requestHead{}, 0, fmt.Errorf("http: header %q could be read as %s", f.name, k)
		}
		switch key {
		case "host":
			hosts++
			if host, err = parseAuthority(f.value); err != nil {
				return requestHead{}, 0, fmt.Errorf("http: Host: %w", err)
			}
			f.value = host.String()
		case "content-length":
			n, err := parseDecimal(f.value)
			if err != nil || h.contentLength >= 0 {
				return requestHead{}, 0, errors.New("http: bad or repeated Content-Length")
			}
			h.contentLength = n
			f.value = strconv.FormatInt(n, 10)
		case "transfer-encoding":
			te++
			if !strings.EqualFold(f.value, "chunked") {
				return requestHead{}, 0, errors.New("http: Transfer-Encoding other than chunked")
			}
			h.chunked = true
			f.value = "chunked"
		case "upgrade":
			h.upgrade = true
		}
		h.fields = append(h.fields, f)
	}
	switch {
	case hosts != 1:
		return requestHead{}, 0, errors.New("http: want exactly one Host header")
	case te > 1:
		return requestHead{}, 0, errors.New("http: repeated Transfer-Encoding")
	case h.chunked && h.contentLength >= 0:
		return requestHead{}, 0, errors.New("http: both Content-Length and Transfer-Encoding")
	case h.chunked && h.version == "HTTP/1.0":
		// RFC 9112 6.1: its framing is faulty.
		return requestHead{}, 0, errors.New("http: Transfer-Encoding in an HTTP/1.0 request")
	}
	// A target that names a site must name the Host's: a server reads it
	// rather than the Host header (RFC 9112 3.2.2).
	if t := h.target; (t.form == absoluteForm || t.form == authorityForm) && t.auth.host != host.host {
		return requestHead{}, 0, fmt.Errorf("http: the request target names %q, Host %q", t.auth.host, host.host)
	}
	if !host.addr {
		h.host = host.host
	}
	return h, end + 4, nil
}

// framing reports whether the lower-case header name frames or routes a
// request.
func framing(name string) bool {
	return name == "host" || name == "content-length" || name == "transfer-encoding"
}

// closeAfter makes the head ask the server to close the connection after
// its answer. A server that answers a request without reading its body
// (a "CL.0" desync; an HTTP/1.0 server and a chunked body) would
// otherwise read the body, which the guard passed on as data, as the next
// request: with the connection closed, it reads nothing more.
func (h *requestHead) closeAfter() {
	var fields []field
	for _, f := range h.fields {
		if !strings.EqualFold(f.name, "connection") {
			fields = append(fields, f)
		}
	}
	h.fields = append(fields, field{name: "Connection", value: "close"})
}

// parseRequestLine parses "method SP request-target SP HTTP-version".
func parseRequestLine(l string) (requestHead, error) {
	h := requestHead{contentLength: -1}
	method, rest, ok1 := strings.Cut(l, " ")
	target, version, ok2 := strings.Cut(rest, " ")
	known := false
	for _, m := range httpMethods {
		known = known || m == method
	}
	switch {
	case !ok1 || !ok2 || !known:
		return h, fmt.Errorf("http: malformed request line %.64q", l)
	case version != "HTTP/1.1" && version != "HTTP/1.0":
		return h, fmt.Errorf("http: version %.16q is not HTTP/1.0 or HTTP/1.1", version)
	}
	t, err := parseTarget(method, target)
	if err != nil {
		return h, err
	}
	h.method, h.target, h.version = method, t, version
	return h, nil
}

// parseTarget parses a request target: a URI without userinfo or
// fragment, in the form the method calls for.
func parseTarget(method, s string) (requestTarget, error) {
	switch {
	case s == "*":
		if method != "OPTIONS" {
			return requestTarget{}, errors.New("http: the request target * is only for OPTIONS")
		}
		return requestTarget{form: asteriskForm}, nil
	case method == "CONNECT":
		a, err := parseAuthority(s)
		if err != nil || a.port == "" {
			return requestTarget{}, fmt.Errorf("http: CONNECT wants host:port, not %.64q", s)
		}
		return requestTarget{form: authorityForm, auth: a}, nil
	case strings.HasPrefix(s, "/"):
		if err := checkPathQuery(s); err != nil {
			return requestTarget{}, err
		}
		return requestTarget{form: originForm, rest: s}, nil
	}
	scheme, rest, ok := strings.Cut(s, "://")
	scheme = strings.ToLower(scheme)
	if !ok || scheme != "http" && scheme != "https" {
		return requestTarget{}, fmt.Errorf("http: the request target %.64q is neither a path nor an http(s) URI", s)
	}
	i := strings.IndexAny(rest, "/?")
	if i < 0 {
		i = len(rest)
	}
	a, err := parseAuthority(rest[:i])
	if err != nil {
		return requestTarget{}, fmt.Errorf("http: request target: %w", err)
	}
	if err := checkPathQuery(rest[i:]); err != nil {
		return requestTarget{}, err
	}
	return requestTarget{form: absoluteForm, scheme: scheme, auth: a, rest: rest[i:]}, nil
}

// checkPathQuery accepts what RFC 3986 allows in a path and a query:
// unreserved and sub-delims characters, ":", "@", "/", "?" and %HH.
func checkPathQuery(s string) error {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			strings.IndexByte("-._~!$&'()*+,;=:@/?", c) >= 0:
		case c == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			i += 2
		default:
			return fmt.Errorf("http: %q is not allowed in a request target", c)
		}
	}
	return nil
}

// parseAuthority parses host [":" port] (RFC 3986 3.2, no userinfo): the
// host a DNS name, an IPv4 address or a bracketed IPv6 address.
func parseAuthority(s string) (authority, error) {
	if strings.Contains(s, "@") {
		return authority{}, fmt.Errorf("userinfo (user@) in %.64q is refused", s)
	}
	var a authority
	host, port, hasPort := s, "", false
	if strings.HasPrefix(s, "[") {
		i := strings.IndexByte(s, ']')
		if i < 0 {
			return authority{}, fmt.Errorf("%.64q: unclosed [", s)
		}
		ip, err := netip.ParseAddr(s[1:i])
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return authority{}, fmt.Errorf("%.64q is not an IPv6 address", s[1:i])
		}
		a.host, a.addr = "["+ip.String()+"]", true
		if r := s[i+1:]; r != "" {
			if port, hasPort = strings.CutPrefix(r, ":"); !hasPort {
				return authority{}, fmt.Errorf("%.64q: junk after ]", s)
			}
		}
	} else {
		host, port, hasPort = strings.Cut(s, ":")
		// ASCII letters, digits, '-', '_' and '.' only: no
		// percent-encoding, and nothing that lower-cases to a letter
		// (U+212A KELVIN SIGN becomes "k").
		if strings.Trim(host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") != "" {
			return authority{}, fmt.Errorf("%.64q is not a DNS name", host)
		}
		if ip, err := netip.ParseAddr(host); err == nil && ip.Is4() {
			a.host, a.addr = ip.String(), true
		} else if a.host = names.Host(host); a.host == "" {
			return authority{}, fmt.Errorf("%.64q is not a DNS name", host)
		}
	}
	if hasPort {
		n, err := parseDecimal(port)
		if err != nil || len(port) > 5 || n > 65535 {
			return authority{}, fmt.Errorf("bad port %.16q", port)
		}
		a.port = strconv.FormatInt(n, 10)
	}
	return a, nil
}

// parseField parses a header field line: token ":" OWS value OWS.
func parseField(l string) (field, error) {
	if l != "" && (l[0] == ' ' || l[0] == '\t') {
		return field{}, errors.New("http: obs-fold (a header line continued on the next) is refused")
	}
	name, value, ok := strings.Cut(l, ":")
	if !ok || !isToken(name) {
		return field{}, fmt.Errorf("http: malformed header line %.64q", l)
	}
	return field{name: name, value: strings.Trim(value, " \t")}, nil
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// parseDecimal parses 1*DIGIT (no sign, no space) up to 18 digits.
func parseDecimal(s string) (int64, error) {
	if s == "" || len(s) > 18 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("%.24q is not a decimal number", s)
	}
	return strconv.ParseInt(s, 10, 64)
}

// CopyRequests copies a guest's HTTP/1 requests to out one at a time,
// checking each head and forwarding it rebuilt, so that every request on
// a kept-alive or pipelined connection names host, and none switches the
// connection to something that is not HTTP (Upgrade, CONNECT). Bodies are
// copied by their Content-Length or chunk by chunk, and a request with a
// body is the connection's last (closeAfter). It returns why it stopped:
// "" at a clean end (the guest closed between requests, or after a
// body), else the refusal or the error; the caller then closes the
// connection.
func CopyRequests(out io.Writer, in *bufio.Reader, host string) string {
	why, _ := copyRequests(out, in, host, nil)
	return why
}

// copyRequests is CopyRequests, with secrets when s is set
// (CopyRequestsSecrets).
func copyRequests(out io.Writer, in *bufio.Reader, host string, s *Secrets) (string, *Found) {
	bodyOut := out
	var guard *Guard
	if s != nil {
		guard = NewGuard(out, s.All, "body")
		bodyOut = guard
	}
	for {
		head, err := readHead(in)
		if err != nil {
			if errors.Is(err, io.EOF) && len(head) == 0 {
				return "", nil
			}
			return "http: " + err.Error(), nil
		}
		h, n, err := parseRequestHead(head)
		switch {
		case err != nil:
			return err.Error(), nil
		case n != len(head):
			return "http: request head ends before its blank line", nil // not reached: readHead stops there
		case h.host != host:
			return fmt.Sprintf("http: a request on the connection names %q, not %q", h.host, host), nil
		case h.upgrade || h.method == "CONNECT":
			return "http: switching protocols (Upgrade, CONNECT) is not allowed on a port allowed by name", nil
		}
		if s != nil {
			if f := s.rewrite(&h); f != nil {
				return "http: " + f.Error(), f
			}
			if len(s.Bound) > 0 {
				h.identityOnly()
			}
		}
		body := h.chunked || h.contentLength > 0
		if body {
			h.closeAfter()
		}
		if s != nil && h.contentLength > 0 && h.contentLength <= MaxCheckedBody {
			// A body of a known, bounded length is checked whole before
			// anything of its request goes out: a refused request never
			// reaches the server.
			b := make([]byte, h.contentLength)
			if _, err := io.ReadFull(in, b); err != nil {
				return "http body: " + err.Error(), nil
			}
			if sec := s.firstIn(string(b)); sec != nil {
				f := &Found{Secret: sec.Name, Place: "body"}
				return "http: " + f.Error(), f
			}
			if _, err := out.Write(append(h.appendTo(nil), b...)); err != nil {
				return "write: " + err.Error(), nil
			}
			return "", nil // the server closes the connection: see closeAfter
		}
		if _, err := out.Write(h.appendTo(nil)); err != nil {
			return "write: " + err.Error(), nil
		}
		switch {
		case h.chunked:
			err = copyChunked(out, bodyOut, in)
		case h.contentLength > 0:
			_, err = io.CopyN(bodyOut, in, h.contentLength)
		}
		if guard != nil && guard.Found() != nil {
			return "http: " + guard.Found().Error(), guard.Found()
		}
		if err != nil {
			return "http body: " + err.Error(), nil
		}
		if body {
			return "", nil // the server closes the connection: see closeAfter
		}
	}
}

// readHead reads one request head, up to and including its blank line
// (at most MaxSniff bytes), every line ended by CRLF.
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
		switch {
		case len(head) > MaxSniff:
			return head, errors.New("request head too long")
		case !bytes.HasSuffix(line, []byte("\r\n")):
			return head, errors.New("a bare LF in the request head (only CRLF ends a line)")
		case len(line) == 2 && len(head) == 2:
			return head, errors.New("an empty line before the request line")
		case len(line) == 2:
			return head, nil
		}
	}
}

// readLine reads one CRLF-ended line of chunk framing, without its CRLF.
func readLine(in *bufio.Reader) (string, error) {
	line, err := in.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			err = errors.New("line too long")
		}
		return "", err
	}
	if err := checkHeadBytes(line, false); err != nil {
		return "", err
	}
	return string(line[:len(line)-2]), nil
}

// copyChunked copies a chunked body (RFC 9112 7.1) with its trailers. The
// chunk data goes out as it is, through data (the body as one stream,
// whatever its chunks); the framing is rebuilt: sizes in plain hex, chunk
// extensions dropped (a recipient must ignore those it does not know),
// trailer fields as parsed, through data too.
func copyChunked(out, data io.Writer, in *bufio.Reader) error {
	for {
		line, err := readLine(in)
		if err != nil {
			return err
		}
		n, err := parseChunkSize(line)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(out, "%x\r\n", n); err != nil {
			return err
		}
		if n == 0 {
			return copyTrailers(data, in)
		}
		if _, err := io.CopyN(data, in, n); err != nil {
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

// parseChunkSize parses chunk-size [BWS chunk-ext]: 1 to 15 hex digits,
// no sign; the extensions are dropped.
func parseChunkSize(line string) (int64, error) {
	i := 0
	for i < len(line) && isHex(line[i]) {
		i++
	}
	ext := strings.TrimLeft(line[i:], " \t")
	if i == 0 || i > 15 || ext != "" && ext[0] != ';' {
		return 0, fmt.Errorf("bad chunk size line %.32q", line)
	}
	return strconv.ParseInt(line[:i], 16, 64)
}

// copyTrailers copies the trailer section after the last chunk, up to
// the blank line that ends the body. Fields that frame or route a request
// are refused there (RFC 9110 6.5.1): a lenient server might use them.
func copyTrailers(out io.Writer, in *bufio.Reader) error {
	for total := 0; ; {
		l, err := readLine(in)
		if err != nil {
			return err
		}
		if total += len(l); total > MaxSniff {
			return errors.New("trailers too long")
		}
		if l == "" {
			_, err := io.WriteString(out, "\r\n")
			return err
		}
		f, err := parseField(l)
		if err != nil {
			return err
		}
		if framing(strings.ReplaceAll(strings.ToLower(f.name), "_", "-")) {
			return fmt.Errorf("%s in a trailer", f.name)
		}
		if _, err := out.Write(f.appendTo(nil)); err != nil {
			return err
		}
	}
}
