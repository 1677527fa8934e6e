package netwire

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
	"testing/iotest"
)

const (
	ghPH  = "vmgs_0123456789abcdef0123456789abcdef"
	ghVal = "ghp_REALVALUE&x=1"
	npmPH = "vmgs_fedcba9876543210fedcba9876543210"
)

func testSecrets(bound bool) *Secrets {
	gh := Secret{Name: "GH_TOKEN", Placeholder: ghPH, Value: ghVal, Headers: []string{"Authorization", "X-Token"}, Query: true}
	npm := Secret{Name: "NPM_TOKEN", Placeholder: npmPH, Value: "npm_secret", Headers: []string{"Authorization"}}
	s := &Secrets{All: []Secret{gh, npm}}
	if bound {
		s.Bound = []Secret{gh}
	}
	return s
}

func TestCopyRequestsSecrets(t *testing.T) {
	for _, tt := range []struct {
		name   string
		bound  bool
		in     string
		out    string // what the server gets; "" with place: nothing of the request
		secret string
		place  string
	}{
		{name: "header replaced", bound: true,
			in:  "GET /repos HTTP/1.1\r\nHost: api.github.test\r\nAuthorization: Bearer " + ghPH + "\r\nAccept-Encoding: gzip\r\n\r\n",
			out: "GET /repos HTTP/1.1\r\nHost: api.github.test\r\nAuthorization: Bearer " + ghVal + "\r\nAccept-Encoding: identity\r\n\r\n"},
		{name: "header name case", bound: true,
			in:  "GET / HTTP/1.1\r\nHost: api.github.test\r\nx-token: " + ghPH + "\r\n\r\n",
			out: "GET / HTTP/1.1\r\nHost: api.github.test\r\nx-token: " + ghVal + "\r\nAccept-Encoding: identity\r\n\r\n"},
		{name: "query replaced, escaped", bound: true,
			in:  "GET /x?token=" + ghPH + "&a=b HTTP/1.1\r\nHost: api.github.test\r\n\r\n",
			out: "GET /x?token=ghp_REALVALUE%26x%3D1&a=b HTTP/1.1\r\nHost: api.github.test\r\nAccept-Encoding: identity\r\n\r\n"},
		{name: "another header", bound: true, in: "GET / HTTP/1.1\r\nHost: api.github.test\r\nCookie: t=" + ghPH + "\r\n\r\n",
			secret: "GH_TOKEN", place: "header Cookie"},
		{name: "path", bound: true, in: "GET /" + ghPH + " HTTP/1.1\r\nHost: api.github.test\r\n\r\n", secret: "GH_TOKEN", place: "path"},
		{name: "another secret's placeholder on this host", bound: true,
			in: "GET / HTTP/1.1\r\nHost: api.github.test\r\nAuthorization: Bearer " + npmPH + "\r\n\r\n", secret: "NPM_TOKEN", place: "header Authorization"},
		{name: "a host it is not bound to", in: "GET / HTTP/1.1\r\nHost: api.github.test\r\nAuthorization: Bearer " + ghPH + "\r\n\r\n",
			secret: "GH_TOKEN", place: "header Authorization"},
		{name: "query on a host it is not bound to", in: "GET /?t=" + ghPH + " HTTP/1.1\r\nHost: api.github.test\r\n\r\n", secret: "GH_TOKEN", place: "query"},
		{name: "body", bound: true,
			in:  "POST /x HTTP/1.1\r\nHost: api.github.test\r\nContent-Length: 44\r\n\r\n{\"t\":\"" + ghPH + "\"}\n",
			out: "", secret: "GH_TOKEN", place: "body"},
		{name: "chunked body, across chunks", bound: true,
			in:  "POST /x HTTP/1.1\r\nHost: api.github.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nvmgs_\r\n20\r\n0123456789abcdef0123456789abcdef\r\n0\r\n\r\n",
			out: "POST /x HTTP/1.1\r\nHost: api.github.test\r\nTransfer-Encoding: chunked\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n5\r\nvmgs_\r\n20\r\n", secret: "GH_TOKEN", place: "body"},
		{name: "a trailer", bound: true,
			in:  "POST /x HTTP/1.1\r\nHost: api.github.test\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nX-Token: " + ghPH + "\r\n\r\n",
			out: "POST /x HTTP/1.1\r\nHost: api.github.test\r\nTransfer-Encoding: chunked\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n1\r\na\r\n0\r\n", secret: "GH_TOKEN", place: "body"},
		{name: "the second request", bound: true,
			in:  "GET /1 HTTP/1.1\r\nHost: api.github.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: api.github.test\r\nX-Other: " + ghPH + "\r\n\r\n",
			out: "GET /1 HTTP/1.1\r\nHost: api.github.test\r\nAccept-Encoding: identity\r\n\r\n", secret: "GH_TOKEN", place: "header X-Other"},
		{name: "no placeholder, not bound: as it was",
			in:  "GET / HTTP/1.1\r\nHost: api.github.test\r\nAccept-Encoding: gzip\r\n\r\n",
			out: "GET / HTTP/1.1\r\nHost: api.github.test\r\nAccept-Encoding: gzip\r\n\r\n"},
	} {
		// Whole, and a byte at a time: a placeholder split across
		// segments is found all the same.
		for _, oneByte := range []bool{false, true} {
			var out bytes.Buffer
			r := bufio.NewReader(strings.NewReader(tt.in))
			if oneByte {
				r = bufio.NewReader(iotest.OneByteReader(strings.NewReader(tt.in)))
			}
			why, found := CopyRequestsSecrets(&out, r, "api.github.test", testSecrets(tt.bound))
			switch {
			case tt.place == "" && (why != "" || found != nil):
				t.Errorf("%s: refused: %s", tt.name, why)
			case tt.place != "" && (found == nil || found.Secret != tt.secret || found.Place != tt.place):
				t.Errorf("%s: found %+v (%s), want %s in %s", tt.name, found, why, tt.secret, tt.place)
			case oneByte && tt.place != "" && !strings.HasPrefix(out.String(), tt.out),
				!(oneByte && tt.place != "") && out.String() != tt.out:
				// A byte at a time, what comes before the byte that
				// completes a placeholder has gone out.
				t.Errorf("%s (one byte at a time: %v): the server got\n%q\nwant\n%q", tt.name, oneByte, out.String(), tt.out)
			}
			if bytes.Contains(out.Bytes(), []byte(ghPH)) || bytes.Contains(out.Bytes(), []byte(npmPH)) {
				t.Errorf("%s: a placeholder went out: %q", tt.name, out.String())
			}
		}
	}
}

func TestValueGuard(t *testing.T) {
	var out bytes.Buffer
	g := NewValueGuard(&out, testSecrets(true).Bound, "answer")
	for _, part := range []string{"HTTP/1.1 200 OK\r\n\r\n{\"echo\": \"Bearer ghp_REAL", "VALUE&x=1\"}"} {
		if _, err := g.Write([]byte(part)); err != nil {
			break
		}
	}
	if f := g.Found(); f == nil || f.Secret != "GH_TOKEN" || f.Place != "answer" {
		t.Fatalf("found %+v", f)
	}
	if strings.Contains(out.String(), ghVal) {
		t.Fatalf("the value reached the guest: %q", out.String())
	}
	if _, err := g.Write([]byte("more")); err == nil {
		t.Fatal("the guard wrote after it found a value")
	}
}

func FuzzCopyRequestsSecrets(f *testing.F) {
	for _, c := range copyCases {
		f.Add([]byte(c.in), true)
	}
	f.Add([]byte("GET /?t="+ghPH+" HTTP/1.1\r\nHost: allowed.test\r\nAuthorization: "+ghPH+" "+npmPH+"\r\n\r\n"), true)
	f.Fuzz(func(t *testing.T, in []byte, bound bool) {
		var out bytes.Buffer
		s := testSecrets(bound)
		why, found := CopyRequestsSecrets(&out, bufio.NewReader(bytes.NewReader(in)), "allowed.test", s)
		if found != nil && why == "" {
			t.Fatal("a placeholder found, and no reason given")
		}
		serverSeesOnly(t, out.Bytes(), "allowed.test")
		for _, sec := range s.All {
			if bytes.Contains(out.Bytes(), []byte(sec.Placeholder)) {
				t.Fatalf("placeholder of %s forwarded: %q", sec.Name, out.Bytes())
			}
		}
		if !bound && bytes.Contains(out.Bytes(), []byte(ghVal)) && !bytes.Contains(in, []byte(ghVal)) {
			t.Fatalf("a value on a host it is not bound to: %q", out.Bytes())
		}
	})
}
