package image

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"

	"golang.org/x/crypto/ssh"
)

// agentKeys are generated fresh for every image: the agent's host key (its
// public half is pinned by the host) and the host's client key (its public
// half is the agent's only authorized key).
type agentKeys struct {
	hostPEM          []byte // private, goes into the guest
	hostAuthorized   []byte // public, stays with the image on the host
	clientPEM        []byte // private, stays with the image on the host (0600)
	clientAuthorized []byte // public, goes into the guest
}

func generateKeys() (*agentKeys, error) {
	hostPEM, hostPub, err := newEd25519("vmgate agent host key")
	if err != nil {
		return nil, err
	}
	clientPEM, clientPub, err := newEd25519("vmgated client key")
	if err != nil {
		return nil, err
	}
	return &agentKeys{
		hostPEM:          hostPEM,
		hostAuthorized:   ssh.MarshalAuthorizedKey(hostPub),
		clientPEM:        clientPEM,
		clientAuthorized: ssh.MarshalAuthorizedKey(clientPub),
	}, nil
}

func newEd25519(comment string) ([]byte, ssh.PublicKey, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate key: %w", err)
	}
	blk, err := ssh.MarshalPrivateKey(priv, comment)
	if err != nil {
		return nil, nil, fmt.Errorf("marshal key: %w", err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		return nil, nil, fmt.Errorf("public key: %w", err)
	}
	return pem.EncodeToMemory(blk), sp, nil
}
