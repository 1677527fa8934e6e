package gateway

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/policy/netrule"
)

func grant(t *testing.T, name string) policy.Secret {
	t.Helper()
	hosts, err := netrule.ParseRules([]string{"api.example.com:443"})
	if err != nil {
		t.Fatal(err)
	}
	return policy.Secret{Name: name, Hosts: hosts, Headers: []string{"Authorization"}}
}

// TestSecretKit: a kit grows a placeholder per new secret and keeps the
// ones it had and its CA (a session's record holds it; a fork shares
// it, so it is never changed in place).
func TestSecretKit(t *testing.T) {
	var k *secretKit
	if got, changed, err := k.withSecrets(nil, "s"); got != nil || changed || err != nil {
		t.Fatalf("no grants: %v %v %v", got, changed, err)
	}
	a, changed, err := k.withSecrets([]policy.Secret{grant(t, "A")}, "s")
	if err != nil || !changed || len(a.Placeholders) != 1 || a.CACert == nil || !strings.HasPrefix(a.Placeholders["A"], placeholderPrefix) {
		t.Fatalf("first grant: %+v %v %v", a, changed, err)
	}
	if same, changed, _ := a.withSecrets([]policy.Secret{grant(t, "A")}, "s"); same != a || changed {
		t.Errorf("the same grant made a new kit")
	}
	b, changed, err := a.withSecrets([]policy.Secret{grant(t, "B")}, "s")
	if err != nil || !changed || b.Placeholders["A"] != a.Placeholders["A"] || string(b.CACert) != string(a.CACert) || len(a.Placeholders) != 1 {
		t.Fatalf("a second secret: %+v (the first kit: %+v)", b, a)
	}
	if b.Placeholders["A"] == b.Placeholders["B"] {
		t.Errorf("two secrets share a placeholder")
	}

	// The netstack gets the granted secret with its hosts, and the other
	// placeholder with none: it may go nowhere.
	on, ca, err := b.onNet([]policy.Secret{grant(t, "B")})
	if err != nil || ca == nil || len(on) != 2 {
		t.Fatalf("onNet: %+v %v %v", on, ca, err)
	}
	if on[0].Name != "A" || len(on[0].Hosts) != 0 || on[1].Name != "B" || len(on[1].Hosts) != 1 || on[1].Placeholder != b.Placeholders["B"] {
		t.Errorf("onNet: %+v", on)
	}

	env := secretEnv(b, []policy.Secret{grant(t, "B")})
	if !slices.Equal(env, []string{"B=" + b.Placeholders["B"], "NODE_EXTRA_CA_CERTS=" + guestCAFile}) {
		t.Errorf("env %q", env)
	}
	// What a session file holds: placeholders and the CA, as JSON.
	j, _ := json.Marshal(sessionRecord{Secrets: b})
	var back sessionRecord
	if err := json.Unmarshal(j, &back); err != nil || back.Secrets.Placeholders["B"] != b.Placeholders["B"] || string(back.Secrets.CAKey) != string(b.CAKey) {
		t.Errorf("a session record's kit after JSON: %+v %v", back.Secrets, err)
	}
}
