package netstack

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vmgate/vmgate/internal/netwire"
	"github.com/vmgate/vmgate/policy/netrule"
)

// Secrets (issue 47): the guest holds placeholders; the netstack puts the
// values in, on the way out, only in requests to the hosts each secret is
// bound to and only in the places it allows (netwire.CopyRequestsSecrets).
//
// For TLS to a bound host the netstack is the guest's server: it
// terminates the guest's TLS with a certificate its session's CA signs
// for the name the guest asked for (the guest trusts that CA, and nothing
// else does), opens its own TLS to the host, verified against the host's
// roots, and forwards the requests rewritten. Connections to every other
// host are not intercepted: plain ones are watched for placeholders
// (netwire.Guard) and cut before one goes out; TLS ones carry what the
// guest encrypted, where a placeholder is as useless as anywhere.
//
// Threat model: the guest is hostile and knows the placeholders. It may
// send a placeholder anywhere; the value goes only where the operator
// bound it, in the places named. It may ask a bound host to echo the
// value back: an intercepted answer that holds a value is cut before the
// bytes that complete it reach the guest, and intercepted requests ask
// for answers without content coding so that this can be seen. What the
// guest does with the bound host's API while it runs is the token's
// scope's to limit. The session CA's key is the daemon's (and the
// netstack's); a guest that had it could only impersonate the bound hosts
// to itself.

// Secret is a secret as the netstack applies it: the hosts it is bound
// to (allowlist syntax), and where it may be placed.
type Secret struct {
	netwire.Secret
	Hosts netrule.Rules
}

// bindsTo reports whether s is bound to name on port.
func (s *Secret) bindsTo(name string, port uint16) bool {
	_, ok := s.Hosts.AllowsName(name, port)
	return ok
}

// secretsFor is what a connection to name:port is forwarded under.
func secretsFor(all []Secret, name string, port uint16) *netwire.Secrets {
	s := &netwire.Secrets{}
	for _, sec := range all {
		s.All = append(s.All, sec.Secret)
		if name != "" && sec.bindsTo(name, port) {
			s.Bound = append(s.Bound, sec.Secret)
		}
	}
	return s
}

// SessionCA is a session's own certificate authority.
type SessionCA struct {
	// CertPEM is what the guest's trust store gets; KeyPEM is kept by the
	// daemon with the session (never in the guest).
	CertPEM, KeyPEM []byte
	cert            *x509.Certificate
	key             crypto.Signer
	mu              sync.Mutex
	leaves          map[string]*tls.Certificate
}

// caLifetime bounds a session CA; a session lives less long
// (sessions.max_lifetime), and a leaf as long as its CA.
const caLifetime = 90 * 24 * time.Hour

// NewSessionCA makes a CA named for the session.
func NewSessionCA(session string) (*SessionCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "vmgate session " + session, Organization: []string{"vmgate"}},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(caLifetime), IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return ParseSessionCA(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}))
}

// ParseSessionCA reads a CA NewSessionCA made.
func ParseSessionCA(certPEM, keyPEM []byte) (*SessionCA, error) {
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, errors.New("session CA: not PEM")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("session CA: %w", err)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("session CA key: %w", err)
	}
	key, ok := k.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, errors.New("session CA: not a CA and its key")
	}
	return &SessionCA{CertPEM: certPEM, KeyPEM: keyPEM, cert: cert, key: key, leaves: map[string]*tls.Certificate{}}, nil
}

// Leaf returns the certificate the netstack shows for name, made once
// per name and CA.
func (ca *SessionCA) Leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok {
		return c, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: ca.cert.NotAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	ca.leaves[name] = c
	return c, nil
}

// prefixConn is a connection whose first bytes were read already.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (c *prefixConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// intercept serves a TLS connection of the guest's to name:port, a host
// secrets are bound to: see the top of this file. It returns whether the
// connection was made and why not (or why it was cut).
func (n *Network) intercept(guest net.Conn, head []byte, rec *Record, dst netip.Addr, port uint16, name string, secrets *netwire.Secrets) (bool, string) {
	p := n.p()
	rec.Intercepted = true
	leaf, err := p.CA.Leaf(name)
	if err != nil {
		return false, "secrets: a certificate for " + name + ": " + err.Error()
	}
	gtls := tls.Server(&prefixConn{Conn: guest, r: io.MultiReader(bytes.NewReader(head), guest)}, &tls.Config{
		Certificates: []tls.Certificate{*leaf}, MinVersion: tls.VersionTLS12,
		// HTTP/1.1 only: the requests are read and rewritten as HTTP/1.
		NextProtos: []string{"http/1.1"}})
	_ = guest.SetDeadline(time.Now().Add(15 * time.Second))
	if err := gtls.Handshake(); err != nil {
		return false, "secrets: the guest's TLS to " + name + ": " + err.Error()
	}
	_ = guest.SetDeadline(time.Time{})
	ctx, cancel := context.WithTimeout(n.ctx, 15*time.Second)
	defer cancel()
	raw, err := n.cfg.Dial(ctx, "tcp", netip.AddrPortFrom(dst, port).String())
	if err != nil {
		return false, "dial: " + err.Error()
	}
	out := tls.Client(raw, &tls.Config{ServerName: name, RootCAs: p.Roots, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}})
	if err := out.HandshakeContext(ctx); err != nil {
		raw.Close()
		// Nothing of the guest's went out: the server is not the one the
		// secret is bound to, or not one this host trusts.
		return false, "secrets: TLS to " + name + ": " + err.Error()
	}
	defer out.Close()
	var cut firstCut
	lc := &liveConn{name: name, dst: dst, port: port, cut: func() { cut.Store(policyCut); out.Close(); guest.Close() }}
	if !n.track(lc) {
		return true, "cut: " + policyCut
	}
	defer n.untrack(lc)
	done := make(chan struct{}, 2)
	var mu sync.Mutex // rec's secret fields, set by either direction
	go func() {
		in := bufio.NewReaderSize(gtls, 32<<10)
		w := &countWriter{w: out, n: n, total: &rec.BytesOut}
		why, found := netwire.CopyRequestsSecrets(w, in, name, secrets)
		if found != nil {
			mu.Lock()
			rec.Secret, rec.SecretPlace = found.Secret, found.Place
			mu.Unlock()
		}
		if why != "" {
			cut.Store(why)
			out.Close()
		} else {
			_ = out.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		// What the host answers goes back watched for the values.
		g := netwire.NewValueGuard(gtls, secrets.Bound, "answer")
		_, _ = io.Copy(&countWriter{w: g, n: n, total: &rec.BytesIn}, out)
		if f := g.Found(); f != nil {
			mu.Lock()
			rec.Secret, rec.SecretPlace = f.Secret, f.Place
			mu.Unlock()
			cut.Store(fmt.Sprintf("secrets: %s sent secret %s's value back", name, f.Secret))
		}
		if g.Found() != nil {
			guest.Close() // nothing more of this connection reaches the guest
		} else {
			_ = gtls.CloseWrite()
		}
		done <- struct{}{}
	}()
	n.awaitBoth(done, func() { out.Close(); guest.Close() })
	if why := cut.Load(); why != "" {
		return true, "cut: " + why
	}
	return true, ""
}

// firstCut keeps the first reason a connection was cut for: what comes
// after it (a read that fails on the closed connection) is its effect.
type firstCut struct {
	mu  sync.Mutex
	why string
}

func (c *firstCut) Store(why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.why == "" {
		c.why = why
	}
}

func (c *firstCut) Load() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.why
}

// placeholderIn finds a placeholder of secrets in b (a connection's
// first bytes).
func placeholderIn(b []byte, secrets []netwire.Secret) *netwire.Found {
	for _, s := range secrets {
		if bytes.Contains(b, []byte(s.Placeholder)) {
			return &netwire.Found{Secret: s.Name, Place: "connection"}
		}
	}
	return nil
}
