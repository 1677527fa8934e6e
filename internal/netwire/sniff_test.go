package netwire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vmgate/vmgate/internal/names"
	"github.com/vmgate/vmgate/internal/netwire/netwiretest"
)

func TestSniffName(t *testing.T) {
	hello := netwiretest.ClientHello(t, "Www.Example.COM")
	if st, err := SniffName(hello); err != nil || st != (Claim{Proto: ProtoTLS, Name: "www.example.com"}) {
		t.Fatalf("tls: %+v %v", st, err)
	}
	for i := 0; i < len(hello); i += 7 {
		if _, err := SniffName(hello[:i]); !errors.Is(err, ErrNeedMore) {
			t.Fatalf("tls prefix %d: %v", i, err)
		}
	}
	// A ClientHello split across two records (and segments) is put back
	// together.
	payload := hello[5 : 5+(int(hello[3])<<8|int(hello[4]))]
	cut := len(payload) / 2
	split := append(append([]byte{0x16, 3, 1, byte(cut >> 8), byte(cut)}, payload[:cut]...),
		append([]byte{0x16, 3, 1, byte((len(payload) - cut) >> 8), byte(len(payload) - cut)}, payload[cut:]...)...)
	if st, err := SniffName(split); err != nil || st != (Claim{Proto: ProtoTLS, Name: "www.example.com"}) {
		t.Fatalf("split ClientHello: %+v %v", st, err)
	}
	for i := 0; i < len(split); i += 11 {
		if _, err := SniffName(split[:i]); !errors.Is(err, ErrNeedMore) {
			t.Fatalf("split ClientHello, prefix %d: %v", i, err)
		}
	}
	ipHello := netwiretest.ClientHello(t, "198.51.100.10") // an IP: no SNI is sent
	if st, err := SniffName(ipHello); err != nil || st != (Claim{Proto: ProtoTLS}) {
		t.Fatalf("tls without SNI: %+v %v", st, err)
	}
	// ECH and ESNI hide the name the connection reaches behind the one
	// the guard reads: they are reported, wherever in the extensions.
	for typ, hidden := range map[uint16]string{0xfe0d: "encrypted_client_hello", 0xffce: "encrypted_server_name"} {
		want := Claim{Proto: ProtoTLS, Name: "www.example.com", Hidden: hidden}
		if st, err := SniffName(netwiretest.WithExtension(t, hello, typ, netwiretest.EchOuter)); err != nil || st != want {
			t.Errorf("%s: %+v %v", hidden, st, err)
		}
		if st, err := SniffName(netwiretest.WithExtension(t, ipHello, typ, nil)); err != nil || st != (Claim{Proto: ProtoTLS, Hidden: hidden}) {
			t.Errorf("%s without SNI: %+v %v", hidden, st, err)
		}
	}
	for _, c := range []struct {
		in, name, proto string
		err             bool
	}{
		{"GET / HTTP/1.1\r\nHost: Example.com:8080\r\nUser-Agent: x\r\n\r\n", "example.com", ProtoHTTP, false},
		{"POST /x HTTP/1.0\r\nhost: a.test\r\n\r\nbody", "a.test", ProtoHTTP, false},
		{"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nUser-Agent: x\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", "", ProtoHTTP, true},
		{"GET /\r\n\r\n", "", ProtoHTTP, true},
		{"SSH-2.0-OpenSSH\r\n", "", ProtoOther, false},
		{"\r\nGET / HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoOther, false},
		{"get / HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoOther, false},
		{"GET http://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET https://A.test:443/x HTTP/1.1\r\nHost: a.test\r\n\r\n", "a.test", ProtoHTTP, false},
		{"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nHost: 198.51.100.1\r\n\r\n", "", ProtoHTTP, false},
		{"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", "", ProtoTLS, true},
		// A bare LF ends a line for lenient servers: refused, not read as
		// part of a header value.
		{"GET / HTTP/1.1\r\nHost: a.test\r\nX: y\n\nGET / HTTP/1.1\nHost: b.test\n\nZ: w\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nHost: a.test\r\nX: y\rGET\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nHost: a.test\r\nX: y\r\n b.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET http://a.test:80@b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET http://a.test@b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nHost: b.test@a.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET * HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n", "a.test", ProtoHTTP, false},
		{"CONNECT b.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n", "a.test", ProtoHTTP, false},
		{"GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nHost: a.test\r\nContent-Length: +1\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.2\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET  / HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nHost: a.test\r\nBad Name: x\r\n\r\n", "", ProtoHTTP, true},
		{"GET / HTTP/1.1\r\nHost: \xe2\x84\xaaey.test\r\n\r\n", "", ProtoHTTP, true}, // KELVIN SIGN lowers to k
		{"GET /\\x HTTP/1.1\r\nHost: a.test\r\n\r\n", "", ProtoHTTP, true},
		{"GET http://[2001:db8::1]:80/ HTTP/1.1\r\nHost: [2001:DB8::1]\r\n\r\n", "", ProtoHTTP, false},
	} {
		st, err := SniffName([]byte(c.in))
		if st.Name != c.name || st.Proto != c.proto || st.Hidden != "" || (err != nil) != c.err {
			t.Errorf("%q: %+v %v", c.in, st, err)
		}
	}
	if _, err := SniffName([]byte("GET / HTTP/1.1\r\nHost: a.test\r\n")); !errors.Is(err, ErrNeedMore) {
		t.Errorf("incomplete head: %v", err)
	}
	// A bare LF is refused at once, without waiting for a blank line.
	if _, err := SniffName([]byte("GET / HTTP/1.1\r\nHost: a.test\n")); err == nil || errors.Is(err, ErrNeedMore) {
		t.Errorf("bare LF in an incomplete head: %v", err)
	}
}

func FuzzSniffName(f *testing.F) {
	f.Add(netwiretest.ClientHello(f, "a.example.com"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Add(netwiretest.WithExtension(f, netwiretest.ClientHello(f, "a.example.com"), 0xfe0d, netwiretest.EchOuter))
	f.Add(netwiretest.WithExtension(f, netwiretest.ClientHello(f, "a.example.com"), 0xffce, nil))
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a.test\r\nX: y\n\nGET / HTTP/1.1\nHost: b.test\n\nZ: w\r\n\r\n",
		"GET http://a.test:80@b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET HTTP://A.test./x?y=%41 HTTP/1.1\r\nHost: a.test:080\r\nX:\tv \r\n\r\n",
		"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n",
		"OPTIONS * HTTP/1.0\r\nHost: [::1]\r\nContent-Length: 0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := SniffName(b)
		if err == nil && st.Name != "" && names.Host(st.Name) != st.Name {
			t.Fatalf("returned an unnormalised name %q", st.Name)
		}
		if err != nil || st.Proto != ProtoHTTP {
			return
		}
		// The head the guard would forward parses to itself, and a
		// lenient server reads the same Host out of it.
		h, _, _ := parseRequestHead(b)
		out := h.appendTo(nil)
		h2, n, err := parseRequestHead(out)
		if err != nil || n != len(out) || !bytes.Equal(h2.appendTo(nil), out) {
			t.Fatalf("%q forwarded as %q, which parses as %q, %v", b, out, h2.appendTo(nil), err)
		}
		if st.Name != "" {
			serverSeesOnly(t, out, st.Name)
		}
	})
}
