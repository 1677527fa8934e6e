// Package netwiretest makes real first flights of TLS clients for the
// tests of what a guest connection claims (packages netwire, netstack).
package netwiretest

import (
	"crypto/tls"
	"net"
	"testing"
	"time"
)

// ClientHello captures the first flight of a real TLS client.
func ClientHello(t testing.TB, serverName string) []byte {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_ = c.Handshake()
	}()
	buf := make([]byte, 4096)
	_ = b.SetReadDeadline(time.Now().Add(2 * time.Second))
	n, err := b.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// EchOuter is the body of an outer encrypted_client_hello extension
// (draft-ietf-tls-esni: type outer, HPKE suite, config id, enc, payload),
// as a client that has an ECH config, or that sends GREASE, puts it.
var EchOuter = []byte{0, 0, 1, 0, 1, 7, 0, 2, 0xaa, 0xbb, 0, 3, 1, 2, 3}

// WithExtension returns the single-record ClientHello hello with one more
// extension, its lengths fixed up.
func WithExtension(t testing.TB, hello []byte, typ uint16, data []byte) []byte {
	t.Helper()
	// record, handshake header, version, random; then session id,
	// cipher suites, compression methods, extensions.
	off, ok := 5+4+2+32, true
	skip := func(lenBytes int) int {
		at := off
		if off+lenBytes > len(hello) {
			ok = false
			return at
		}
		n := 0
		for _, b := range hello[off : off+lenBytes] {
			n = n<<8 | int(b)
		}
		off += lenBytes + n
		return at
	}
	skip(1)
	skip(2)
	skip(1)
	extAt := skip(2)
	if !ok || off != len(hello) {
		t.Fatalf("not a single-record ClientHello: %x", hello)
	}
	ext := []byte{byte(typ >> 8), byte(typ), byte(len(data) >> 8), byte(len(data))}
	ext = append(ext, data...)
	out := append(append([]byte(nil), hello...), ext...)
	put16 := func(at, add int) {
		v := int(out[at])<<8 | int(out[at+1]) + add
		out[at], out[at+1] = byte(v>>8), byte(v)
	}
	put16(3, len(ext))     // record length
	put16(7, len(ext))     // handshake length (low 16 of 24 bits: fine below 64 KiB)
	put16(extAt, len(ext)) // extensions length
	return out
}
