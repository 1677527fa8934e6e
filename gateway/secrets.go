package gateway

// Secrets (policy [[secret]], docs/secrets.md): a command that asks for
// one sees a placeholder in its variable; the VM's netstack puts the
// value in on the way to the secret's hosts (vm/netstack secrets.go).
// Here the daemon keeps, per fresh VM and per session, the placeholders
// and the CA its guest trusts (a secretKit: placeholders and CA, never a
// value), installs that CA into the guest's trust store, and gives the
// netstack each command's secrets with their values.
//
// A session keeps its kit in its record: its save point and its forks
// hold the placeholders and the CA's certificate (the guest's), never a
// value, and a fork's or a resumed session's placeholders still work.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/netstack"
)

// placeholderPrefix starts every placeholder: a reader of a guest's
// environment knows it for what it is.
const placeholderPrefix = "vmgate_secret_"

// secretKit is what a VM or a session holds of its secrets: a
// placeholder per secret name, and its CA (certificate and key, PEM). It
// is never changed once made (withSecrets makes another): a fork's record
// shares its parent's.
type secretKit struct {
	Placeholders map[string]string `json:"placeholders,omitempty"`
	CACert       []byte            `json:"ca_cert,omitempty"`
	CAKey        []byte            `json:"ca_key,omitempty"`
}

// names are the secrets the kit holds placeholders for, sorted.
func (k *secretKit) names() []string {
	if k == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(k.Placeholders))
}

// lacks reports whether k lacks a placeholder of grants, or a CA.
func (k *secretKit) lacks(grants []policy.Secret) bool {
	if len(grants) == 0 {
		return false
	}
	if k == nil || k.CACert == nil {
		return true
	}
	for _, g := range grants {
		if _, ok := k.Placeholders[g.Name]; !ok {
			return true
		}
	}
	return false
}

// newPlaceholder makes a placeholder: 128 random bits, useless anywhere
// but in this VM's requests to the secret's hosts.
func newPlaceholder() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return placeholderPrefix + hex.EncodeToString(b)
}

// withSecrets returns a kit that holds a placeholder for each of grants
// and a CA, and whether it is new (k itself when it held them all).
// label names the CA (a session's name, or a VM's id).
func (k *secretKit) withSecrets(grants []policy.Secret, label string) (*secretKit, bool, error) {
	if !k.lacks(grants) {
		return k, false, nil
	}
	n := &secretKit{Placeholders: map[string]string{}}
	if k != nil {
		maps.Copy(n.Placeholders, k.Placeholders)
		n.CACert, n.CAKey = k.CACert, k.CAKey
	}
	for _, g := range grants {
		if _, ok := n.Placeholders[g.Name]; !ok {
			n.Placeholders[g.Name] = newPlaceholder()
		}
	}
	if n.CACert == nil {
		ca, err := netstack.NewSessionCA(label)
		if err != nil {
			return nil, false, fmt.Errorf("secrets: a CA: %w", err)
		}
		n.CACert, n.CAKey = ca.CertPEM, ca.KeyPEM
	}
	return n, true, nil
}

// onNet is the kit's secrets as the netstack applies them: those of
// grants with their values and hosts, and every other placeholder the
// guest knows with neither (it may go nowhere).
func (k *secretKit) onNet(grants []policy.Secret) ([]netstack.Secret, *netstack.SessionCA, error) {
	if k == nil || len(k.Placeholders) == 0 {
		return nil, nil, nil
	}
	var out []netstack.Secret
	for _, name := range k.names() {
		s := netstack.Secret{}
		s.Name, s.Placeholder = name, k.Placeholders[name]
		if i := slices.IndexFunc(grants, func(g policy.Secret) bool { return g.Name == name }); i >= 0 {
			g := grants[i]
			s.Value, s.Headers, s.Query, s.Hosts = g.Value.Reveal(), g.Headers, g.Query, g.Hosts
		}
		out = append(out, s)
	}
	ca, err := netstack.ParseSessionCA(k.CACert, k.CAKey)
	if err != nil {
		return nil, nil, fmt.Errorf("secrets: %w", err)
	}
	return out, ca, nil
}

// Where a guest is told to trust its CA: the file of its own, and the
// bundles of the distributions' trust stores it is appended to.
const guestCAFile = "/etc/ssl/certs/vmgate-session-ca.pem"

var guestBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"}

// maxBundle bounds a guest's trust store bundle read to be extended.
const maxBundle = 8 << 20

// secretEnv is what a command that holds secrets gets in its environment:
// each granted secret's placeholder in its variable, and where its CA is
// for the runtimes that do not read the system's trust store.
func secretEnv(k *secretKit, grants []policy.Secret) []string {
	if k == nil || len(grants) == 0 {
		return nil
	}
	var env []string
	for _, g := range grants {
		if p, ok := k.Placeholders[g.Name]; ok {
			env = append(env, g.Name+"="+p)
		}
	}
	return append(env, "NODE_EXTRA_CA_CERTS="+guestCAFile)
}

// installCA makes v's guest trust certPEM: its own file, appended to
// each trust store bundle the guest has (a regular file), or the first
// bundle made when it has none. It runs as root through the agent's file
// operations; the guest may undo it, which only breaks its own HTTPS to
// the secrets' hosts.
func installCA(ctx context.Context, v *vm.VM, certPEM []byte) error {
	root := vm.FSCaller{User: "root"}
	fail := func(what string, err error) error {
		return fmt.Errorf("secrets: the guest's trust store: %s: %w", what, err)
	}
	if err := v.FSMkdir(ctx, root, "/etc/ssl/certs", true); err != nil && !errors.Is(err, vm.ErrFileExists) {
		return fail("mkdir /etc/ssl/certs", err)
	}
	if _, err := v.FSWrite(ctx, root, guestCAFile, 0o644, int64(len(certPEM)), bytes.NewReader(certPEM)); err != nil {
		return fail(guestCAFile, err)
	}
	extended := false
	for _, b := range guestBundles {
		e, err := v.FSStat(ctx, root, b)
		if errors.Is(err, vm.ErrFileNotFound) || errors.Is(err, vm.ErrNotDir) || err == nil && e.Type != vm.FileRegular {
			continue
		}
		if err != nil {
			return fail(b, err)
		}
		var buf bytes.Buffer
		if _, err := v.FSRead(ctx, root, b, maxBundle, &buf); err != nil {
			return fail(b, err)
		}
		if !bytes.HasSuffix(buf.Bytes(), []byte("\n")) && buf.Len() > 0 {
			buf.WriteByte('\n')
		}
		buf.Write(certPEM)
		if _, err := v.FSWrite(ctx, root, b, 0, int64(buf.Len()), &buf); err != nil {
			return fail(b, err)
		}
		extended = true
	}
	if !extended {
		if _, err := v.FSWrite(ctx, root, guestBundles[0], 0o644, int64(len(certPEM)), bytes.NewReader(certPEM)); err != nil {
			return fail(guestBundles[0], err)
		}
	}
	return nil
}

// armKit gives v the secrets grants grant on top of old: a placeholder
// each and a CA its guest trusts, installed when it is new. It returns
// the kit v holds now, and whether it changed (to be kept).
func armKit(ctx context.Context, v *vm.VM, old *secretKit, grants []policy.Secret, label string) (*secretKit, bool, error) {
	k, changed, err := old.withSecrets(grants, label)
	if err != nil || !changed {
		return k, false, err
	}
	if old == nil || !bytes.Equal(old.CACert, k.CACert) {
		if err := installCA(ctx, v, k.CACert); err != nil {
			return nil, false, err
		}
	}
	return k, true, nil
}

// armSession gives ss's VM the secrets grants grant (armKit), and keeps
// its kit in its record before the command that asked runs.
//
// Precondition: the caller uses ss (a share or alone), which runs.
func (x *sessions) armSession(ctx context.Context, ss *session, grants []policy.Secret) error {
	if !ss.kit().lacks(grants) {
		return nil
	}
	// Two commands that ask at once must not each make a kit and keep
	// only the last: the first one's placeholder would be lost.
	x.arming.Lock()
	defer x.arming.Unlock()
	k, changed, err := armKit(ctx, ss.running(), ss.kit(), grants, ss.Name)
	if err != nil || !changed {
		return err
	}
	if err := x.store(ss, func(r *sessionRecord) { r.Secrets = k }); err != nil {
		return err
	}
	ss.mu.Lock()
	ss.Secrets = k
	ss.mu.Unlock()
	return nil
}

// secretsOf are the secrets the session of key holds, nil when there is
// none.
func (x *sessions) secretsOf(key sessionKey) []string {
	if ss := x.get(key); ss != nil {
		return ss.kit().names()
	}
	return nil
}

// netPolicy is the netstack policy of egress e (nil: nothing allowed),
// its records audited by hook, with k's secrets as grants make them.
func netPolicy(e *netrule.Egress, hook func(netstack.Record), k *secretKit, grants []policy.Secret) (netstack.Policy, error) {
	pol := netstack.Policy{Audit: hook}
	if e != nil {
		pol.Egress = *e
	}
	var err error
	pol.Secrets, pol.CA, err = k.onNet(grants)
	return pol, err
}

// secretNames lists the secrets a record names, for an audit record.
func secretNames(grants []policy.Secret) []string {
	var out []string
	for _, g := range grants {
		out = append(out, g.Name)
	}
	return out
}
