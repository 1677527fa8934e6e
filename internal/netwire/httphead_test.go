package netwire

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// copyCases are guest byte streams on a port allowed by name for
// allowed.test: what the server is sent (the heads rebuilt from what the
// guard parsed) and why the guard stopped ("" for a clean end).
var copyCases = []struct {
	name, in, out, why string
}{
	{"one request", "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", ""},
	{"head rebuilt from what was parsed",
		"GET /a?b=c HTTP/1.1\r\nHost:  Allowed.Test.:080 \r\nX-A:\tb c \r\nX-Empty:\r\nContent-Length: 005\r\n\r\nhello",
		"GET /a?b=c HTTP/1.1\r\nHost: allowed.test:80\r\nX-A: b c\r\nX-Empty:\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", ""},
	{"absolute form rebuilt",
		"GET HTTP://ALLOWED.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n", ""},
	{"chunk framing rebuilt, extensions dropped, data untouched",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: Chunked\r\n\r\n05;a=\"b\"\r\nhe\nlo\r\n0 \r\nX-T: v \r\n\r\n",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhe\nlo\r\n0\r\nX-T: v\r\n\r\n", ""},
	// A server that answers without reading a body (CL.0) would read the
	// body as the next request: the forwarded head asks it to close, and
	// nothing more goes out on the connection.
	{"a body ends the connection",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nConnection: keep-alive\r\nContent-Length: 41\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\nX: \r\n\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 41\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\nX: \r\n\r\n", ""},
	{"underscore for a hyphen", "POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer_Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n", "", "could be read as transfer-encoding"},
	{"kept alive: every request checked",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", `names "other.test"`},
	// Finding: a bare LF ends a line for lenient servers (Go's net/http,
	// nginx): the guard must not read it as part of a header value.
	{"bare LF hides a second request",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\nX: y\n\nGET /secret HTTP/1.1\nHost: other.test\n\nZ: w\r\n\r\n",
		"", "bare LF"},
	{"bare LF after a good request",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\nGET / HTTP/1.1\nHost: other.test\n\n",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "bare LF"},
	{"bare CR", "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: a\rb\r\n\r\n", "", "CR"},
	{"NUL in a value", "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: a\x00b\r\n\r\n", "", "control byte"},
	{"obs-fold", "GET / HTTP/1.1\r\nHost: allowed.test\r\nX: a\r\n other.test\r\n\r\n", "", "obs-fold"},
	// Finding: the authority was read before its userinfo was removed.
	{"userinfo in an absolute-form target",
		"GET http://allowed.test:80@other.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "", "userinfo"},
	{"userinfo in Host", "GET / HTTP/1.1\r\nHost: allowed.test@other.test\r\n\r\n", "", "userinfo"},
	{"backslash in an absolute-form authority",
		"GET http://other.test\\.allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "", "DNS name"},
	{"fragment in a target", "GET /#@other.test HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "", "request target"},
	{"two Hosts", "GET / HTTP/1.1\r\nHost: allowed.test\r\nhost: allowed.test\r\n\r\n", "", "one Host"},
	{"signed Content-Length", "POST / HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: +5\r\n\r\nGET /", "", "Content-Length"},
	{"signed chunk size",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n", "chunk size"},
	{"bare LF after a chunk size",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n", "bare LF"},
	{"Host in a trailer",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nHost: other.test\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n", "trailer"},
	{"Transfer-Encoding in HTTP/1.0",
		"POST / HTTP/1.0\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "", "HTTP/1.0"},
	{"empty line between requests",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n\r\nGET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", "empty line"},
}

func TestCopyRequests(t *testing.T) {
	for _, c := range copyCases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			why := CopyRequests(&out, bufio.NewReader(strings.NewReader(c.in)), "allowed.test")
			if out.String() != c.out || (c.why == "") != (why == "") || !strings.Contains(why, c.why) {
				t.Errorf("sent %q, stopped with %q\nwant %q, %q", out.String(), why, c.out, c.why)
			}
			serverSeesOnly(t, out.Bytes(), "allowed.test")
		})
	}
}

// serverSeesOnly reads what the guard forwarded as Go's lenient net/http
// server would, and fails if any request it finds names another host.
func serverSeesOnly(t *testing.T, forwarded []byte, host string) {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(forwarded))
	for {
		req, err := http.ReadRequest(r)
		if err != nil {
			return
		}
		for _, h := range []string{req.Host, req.URL.Host} {
			if hn, _, err := net.SplitHostPort(h); err == nil {
				h = hn
			}
			if h != "" && h != host {
				t.Fatalf("a server reads a request for %q (%s %s) out of %q", h, req.Method, req.URL, forwarded)
			}
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
	}
}

func FuzzCopyRequests(f *testing.F) {
	for _, c := range copyCases {
		f.Add([]byte(c.in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		CopyRequests(&out, bufio.NewReader(bytes.NewReader(in)), "allowed.test")
		serverSeesOnly(t, out.Bytes(), "allowed.test")
		// What was forwarded is canonical: the guard forwards it again
		// byte for byte.
		var again bytes.Buffer
		CopyRequests(&again, bufio.NewReader(bytes.NewReader(out.Bytes())), "allowed.test")
		if !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatalf("forwarded %q, then %q", out.Bytes(), again.Bytes())
		}
	})
}
