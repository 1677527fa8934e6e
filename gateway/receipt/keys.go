package receipt

import (
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
)

// Keys are stored in the formats OpenSSL reads: the private key as a
// PKCS #8 PEM block ("PRIVATE KEY"), the public key as a PKIX PEM block
// ("PUBLIC KEY"). `openssl pkey -in receipt.key -pubout` prints the public
// half, and `openssl pkeyutl -verify -pubin -inkey receipt.pub -rawin`
// checks a signature without vmgate.

// Fingerprint names a public key: "SHA256:" and the unpadded base64 of the
// SHA-256 of its 32 bytes.
func Fingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return "SHA256:" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// MarshalPrivateKey encodes key as a PKCS #8 PEM block.
func MarshalPrivateKey(key ed25519.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("receipt key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKey decodes a PKCS #8 PEM block holding an ed25519 key;
// anything else (another key type, trailing data, no PEM) is an error.
func ParsePrivateKey(data []byte) (ed25519.PrivateKey, error) {
	blk, rest := pem.Decode(data)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil, errors.New("not a PEM \"PRIVATE KEY\" block (PKCS #8)")
	}
	if len(pemTrim(rest)) > 0 {
		return nil, errors.New("data after the PEM block")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an ed25519 key", k)
	}
	return ek, nil
}

// MarshalPublicKey encodes pub as a PKIX PEM block.
func MarshalPublicKey(pub ed25519.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil { // cannot happen for an ed25519 key
		panic(fmt.Sprintf("receipt: marshal public key: %v", err))
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// ParsePublicKey decodes a PKIX PEM block holding an ed25519 public key.
func ParsePublicKey(data []byte) (ed25519.PublicKey, error) {
	blk, rest := pem.Decode(data)
	if blk == nil || blk.Type != "PUBLIC KEY" {
		return nil, errors.New("not a PEM \"PUBLIC KEY\" block")
	}
	if len(pemTrim(rest)) > 0 {
		return nil, errors.New("data after the PEM block")
	}
	k, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("a %T, not an ed25519 key", k)
	}
	return ek, nil
}

// EncodePublicKey is pub as unpadded standard base64 of its 32 bytes, as
// the audit chain's checkpoints carry it; DecodePublicKey reverses it.
func EncodePublicKey(pub ed25519.PublicKey) string {
	return base64.RawStdEncoding.EncodeToString(pub)
}

// DecodePublicKey decodes EncodePublicKey's form.
func DecodePublicKey(s string) (ed25519.PublicKey, error) {
	b, err := base64.RawStdEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, errors.New("not the base64 of a 32-byte ed25519 public key")
	}
	return ed25519.PublicKey(b), nil
}

func pemTrim(b []byte) []byte {
	for len(b) > 0 && (b[0] == '\n' || b[0] == '\r' || b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}
