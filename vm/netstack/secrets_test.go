package netstack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/vmgate/vmgate/internal/netwire"
	"github.com/vmgate/vmgate/policy/netrule"
)

const (
	tokPH  = "vmgs_00112233445566778899aabbccddeeff"
	tokVal = "real-token-value-42"
)

// dialTLS opens a TLS connection from the guest to addr, trusting roots
// for name, offering protos.
func (g *guest) dialTLS(addr netip.AddrPort, name string, roots *x509.CertPool, protos []string, maxVersion ...uint16) (*tls.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := gonet.DialContextTCP(ctx, g.st, tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFromSlice(addr.Addr().AsSlice()), Port: addr.Port()}, ipv4.ProtocolNumber)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	cfg := &tls.Config{ServerName: name, RootCAs: roots, NextProtos: protos, MinVersion: tls.VersionTLS10}
	if len(maxVersion) > 0 {
		cfg.MaxVersion = maxVersion[0]
	}
	tc := tls.Client(c, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return tc, nil
}

func roundTrip(c net.Conn, raw string) (string, error) {
	defer c.Close()
	if _, err := io.WriteString(c, raw); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

func TestSecrets(t *testing.T) {
	var got atomic.Value // the Authorization the bound host saw last
	var hits atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		got.Store(r.Header.Get("Authorization"))
		if r.URL.Path == "/echo" {
			fmt.Fprintf(w, "you sent %s", r.Header.Get("Authorization"))
			return
		}
		fmt.Fprintf(w, "hello %s, encoding %q", r.Host, r.Header.Get("Accept-Encoding"))
	})
	bound := httptest.NewUnstartedServer(handler)
	bound.StartTLS()
	defer bound.Close()
	plain := httptest.NewServer(handler)
	defer plain.Close()
	boundReal := netip.MustParseAddrPort(strings.TrimPrefix(bound.URL, "https://"))
	plainReal := netip.MustParseAddrPort(strings.TrimPrefix(plain.URL, "http://"))
	public := netip.MustParseAddr("198.51.100.20")
	tlsAddr, plainAddr := netip.AddrPortFrom(public, boundReal.Port()), netip.AddrPortFrom(public, plainReal.Port())
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		switch addr {
		case tlsAddr.String():
			return d.DialContext(ctx, network, boundReal.String())
		case plainAddr.String():
			return d.DialContext(ctx, network, plainReal.String())
		}
		return nil, fmt.Errorf("test dial: unexpected %s", addr)
	}
	resolve := func(_ context.Context, name string) ([]netip.Addr, error) { return []netip.Addr{public}, nil }
	rules, err := netrule.ParseRules([]string{fmt.Sprintf("api.secret.test:%d", tlsAddr.Port()), fmt.Sprintf("other.test:%d", tlsAddr.Port()),
		fmt.Sprintf("api.secret.test:%d", plainAddr.Port()), fmt.Sprintf("other.test:%d", plainAddr.Port())})
	if err != nil {
		t.Fatal(err)
	}
	hosts, _ := netrule.ParseRules([]string{fmt.Sprintf("api.secret.test:%d", tlsAddr.Port()), fmt.Sprintf("api.secret.test:%d", plainAddr.Port())})
	ca, err := NewSessionCA("s1")
	if err != nil {
		t.Fatal(err)
	}
	// The real host's certificate names example.com; the test's server
	// is trusted for that name by the netstack's roots.
	hostRoots := x509.NewCertPool()
	hostRoots.AddCert(bound.Certificate())
	secret := Secret{Secret: netwire.Secret{Name: "TOKEN", Placeholder: tokPH, Value: tokVal, Headers: []string{"Authorization"}}, Hosts: hosts}
	pol := Policy{Egress: netrule.Egress{Rules: rules, ConnectRate: 6000}, Secrets: []Secret{secret}, CA: ca, Roots: hostRoots}
	g, audit := startNetwork(t, Config{Policy: pol, Resolve: resolve, Dial: dial})
	guestRoots := x509.NewCertPool()
	if !guestRoots.AppendCertsFromPEM(ca.CertPEM) {
		t.Fatal("the session CA does not parse")
	}
	g.resolve(t, "api.secret.test")
	g.resolve(t, "other.test")
	req := func(host, path, extra string) string {
		return fmt.Sprintf("GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", path, host, extra)
	}
	// httptest's certificate is for example.com: the intercepting
	// netstack checks the real host as that name only through its roots,
	// so the test's host is reached by the IP-named certificate; its
	// ServerName is what the guest asked for. Go's test certificate
	// names 127.0.0.1 and example.com, not api.secret.test: the netstack
	// refuses it, which is the case "a certificate that does not verify".
	t.Run("a host whose certificate does not verify", func(t *testing.T) {
		before := hits.Load()
		c, err := g.dialTLS(tlsAddr, "api.secret.test", guestRoots, nil)
		if err == nil {
			_, err = roundTrip(c, req("api.secret.test", "/", "Authorization: Bearer "+tokPH+"\r\n"))
		}
		r, ok := audit.find(func(r Record) bool { return r.Intercepted && !r.Allowed })
		if !ok || !strings.Contains(r.Reason, "certificate") || hits.Load() != before {
			t.Fatalf("audit %+v (err %v), server hits %d", r, err, hits.Load()-before)
		}
	})

	// The test server's certificate is valid for example.com: bind the
	// secret to that name, which the guest resolves like any other.
	exHosts, _ := netrule.ParseRules([]string{fmt.Sprintf("example.com:%d", tlsAddr.Port()), fmt.Sprintf("example.com:%d", plainAddr.Port())})
	exRules, _ := netrule.ParseRules(append([]string{fmt.Sprintf("example.com:%d", tlsAddr.Port()), fmt.Sprintf("example.com:%d", plainAddr.Port())}, ruleTexts(rules)...))
	secret.Hosts = exHosts
	pol.Secrets, pol.Egress.Rules = []Secret{secret}, exRules
	g, audit = startNetwork(t, Config{Policy: pol, Resolve: resolve, Dial: dial})
	g.resolve(t, "example.com")
	g.resolve(t, "other.test")

	t.Run("TLS to the bound host: the value goes in", func(t *testing.T) {
		c, err := g.dialTLS(tlsAddr, "example.com", guestRoots, []string{"http/1.1"})
		if err != nil {
			t.Fatal(err)
		}
		if cs := c.ConnectionState(); cs.NegotiatedProtocol != "http/1.1" || cs.PeerCertificates[0].Issuer.CommonName != "vmgate session s1" {
			t.Fatalf("the guest's TLS: %q, issued by %q", cs.NegotiatedProtocol, cs.PeerCertificates[0].Issuer.CommonName)
		}
		body, err := roundTrip(c, req("example.com", "/", "Authorization: Bearer "+tokPH+"\r\nAccept-Encoding: gzip\r\n"))
		if err != nil || !strings.Contains(body, `hello example.com, encoding "identity"`) || got.Load() != "Bearer "+tokVal {
			t.Fatalf("%v %q; the server got %q", err, body, got.Load())
		}
		if r, ok := audit.find(func(r Record) bool { return r.Intercepted && r.Allowed }); !ok || r.Reason != "" || r.Name != "example.com" {
			t.Fatalf("audit: %+v", r)
		}
	})
	t.Run("plain HTTP to the bound host", func(t *testing.T) {
		got.Store("")
		body, err := g.send(plainAddr, req("example.com", "/", "Authorization: Bearer "+tokPH+"\r\n"))
		if err != nil || !strings.Contains(body, "hello example.com") || got.Load() != "Bearer "+tokVal {
			t.Fatalf("%v %q; the server got %q", err, body, got.Load())
		}
	})
	t.Run("the value echoed back is cut", func(t *testing.T) {
		c, err := g.dialTLS(tlsAddr, "example.com", guestRoots, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := roundTrip(c, req("example.com", "/echo", "Authorization: Bearer "+tokPH+"\r\n"))
		if strings.Contains(body, tokVal) {
			t.Fatalf("the value reached the guest: %q", body)
		}
		if r, ok := audit.find(func(r Record) bool { return r.Secret == "TOKEN" && r.SecretPlace == "answer" }); !ok || !strings.Contains(r.Reason, "value back") {
			t.Fatalf("audit: %+v", r)
		}
	})
	for name, c := range map[string]struct {
		addr  netip.AddrPort
		tls   bool
		raw   string
		place string
	}{
		"another host":             {plainAddr, false, req("other.test", "/", "Authorization: Bearer "+tokPH+"\r\n"), "header Authorization"},
		"another header":           {tlsAddr, true, req("example.com", "/", "X-Api-Key: "+tokPH+"\r\n"), "header X-Api-Key"},
		"a body":                   {tlsAddr, true, "POST / HTTP/1.1\r\nHost: example.com\r\nContent-Length: 37\r\n\r\n" + tokPH, "body"},
		"not HTTP to another host": {netip.AddrPortFrom(public, tlsAddr.Port()), false, "HELLO " + tokPH + "\r\n", ""},
	} {
		t.Run("a placeholder in "+name, func(t *testing.T) {
			before := hits.Load()
			var body string
			if c.tls {
				tc, err := g.dialTLS(c.addr, "example.com", guestRoots, nil)
				if err != nil {
					t.Fatal(err)
				}
				body, _ = roundTrip(tc, c.raw)
			} else {
				body, _ = g.send(c.addr, c.raw)
			}
			if strings.Contains(body, "hello") || hits.Load() != before {
				t.Fatalf("the request reached the server: %q", body)
			}
			if c.place == "" {
				return // not HTTP, not a name: refused before its claim
			}
			if r, ok := audit.find(func(r Record) bool { return r.Secret == "TOKEN" && r.SecretPlace == c.place }); !ok || !strings.Contains(r.Reason, "secret TOKEN") {
				t.Fatalf("audit: %+v", r)
			}
		})
	}
	t.Run("HTTP/2 only is refused", func(t *testing.T) {
		if _, err := g.dialTLS(tlsAddr, "example.com", guestRoots, []string{"h2"}); err == nil {
			t.Fatal("a guest offering only h2 got a connection")
		}
	})
	t.Run("a TLS version the proxy refuses", func(t *testing.T) {
		before := hits.Load()
		if _, err := g.dialTLS(tlsAddr, "example.com", guestRoots, nil, tls.VersionTLS11); err == nil {
			t.Fatal("a guest offering only TLS 1.1 got a connection")
		}
		if hits.Load() != before {
			t.Fatal("the server was reached")
		}
		if r, ok := audit.find(func(r Record) bool {
			return r.Intercepted && strings.Contains(r.Reason, "the guest's TLS to example.com")
		}); !ok {
			t.Fatalf("audit: %+v", r)
		}
	})
	t.Run("a malformed request head", func(t *testing.T) {
		before := hits.Load()
		tc, err := g.dialTLS(tlsAddr, "example.com", guestRoots, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := roundTrip(tc, "GET / HTTP/1.1\r\nHost example.com\r\nAuthorization: Bearer "+tokPH+"\r\n\r\n")
		if strings.Contains(body, "hello") || hits.Load() != before {
			t.Fatalf("a malformed head reached the server: %q", body)
		}
	})
	t.Run("TLS to a host without a secret is not intercepted", func(t *testing.T) {
		// other.test is not bound: the guest talks to the real server,
		// whose certificate the session CA did not sign.
		if _, err := g.dialTLS(tlsAddr, "other.test", guestRoots, nil); err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("the guest trusted the server of a host without a secret: %v", err)
		}
	})
}

func ruleTexts(rs netrule.Rules) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Text)
	}
	return out
}

func TestSessionCA(t *testing.T) {
	ca, err := NewSessionCA("s")
	if err != nil {
		t.Fatal(err)
	}
	again, err := ParseSessionCA(ca.CertPEM, ca.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := again.Leaf("api.example.test")
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(leaf.Certificate[0])
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.CertPEM)
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "api.example.test", Roots: roots}); err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "other.test", Roots: roots}); err == nil {
		t.Fatal("a leaf verified for another name")
	}
	if l2, _ := again.Leaf("api.example.test"); l2 != leaf {
		t.Fatal("a leaf was made twice")
	}
	if _, err := ParseSessionCA(ca.CertPEM, []byte("junk")); err == nil {
		t.Fatal("a CA without its key parsed")
	}
}
