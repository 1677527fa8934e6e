package policy

import (
	"reflect"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/policy/netrule"
)

// netTOML has a profile with a network and one without.
const netTOML = `
version = 1

[[profile]]
name = "net"
match = { uids = [1000] }
sessions = { allowed = true }
  [profile.network]
  mode = "allowlist"
  allow = ["*.debian.org:80", "repo.test:80", "repo.test:443", "203.0.113.0/24:*"]
  max_connections = 7

[[profile]]
name = "offline"
match = { uids = [1001] }
sessions = { allowed = true }
`

var (
	idNet     = Identity{UID: 1000, User: "n"}
	idOffline = Identity{UID: 1001, User: "o"}
)

func limit(rules ...string) *NetLimit { return &NetLimit{Allow: rules} }

func ruleTexts(n *NetworkPolicy) []string {
	if n == nil {
		return nil
	}
	out := []string{}
	for _, r := range n.Rules {
		out = append(out, r.Text)
	}
	return out
}

func TestDecideNetNarrowing(t *testing.T) {
	p := mustParse(t, "net.toml", netTOML)
	profile := []string{"*.debian.org:80", "repo.test:80", "repo.test:443", "203.0.113.0/24:*"}
	tests := []struct {
		name      string
		id        Identity
		net, lock *NetLimit
		rules     []string // nil: no network (no NIC)
		narrowed  []string
		rule      string // of a refusal
		reason    string // substring of a refusal's reason
	}{
		{"the profile's", idNet, nil, nil, profile, nil, "", ""},
		{"no network", idNet, limit(), nil, []string{}, []string{NarrowedByRequest}, "", ""},
		{"a subset", idNet, limit("repo.test:80"), nil, []string{"repo.test:80"}, []string{NarrowedByRequest}, "", ""},
		{"within a wildcard", idNet, limit("deb.debian.org:80", "203.0.113.7:443"), nil,
			[]string{"deb.debian.org:80", "203.0.113.7:443"}, []string{NarrowedByRequest}, "", ""},
		{"outside: another name", idNet, limit("repo.test:80", "evil.test:80"), nil, nil, nil, RuleNetAllow,
			`network rule "evil.test:80" is not within the profile's network.allow (*.debian.org:80 repo.test:80 repo.test:443 203.0.113.0/24:*)`},
		{"outside: another port", idNet, limit("repo.test:22"), nil, nil, nil, RuleNetAllow, `"repo.test:22" is not within`},
		{"outside: every port", idNet, limit("repo.test:*"), nil, nil, nil, RuleNetAllow, `"repo.test:*" is not within`},
		{"outside: the wildcard's own name", idNet, limit("debian.org:80"), nil, nil, nil, RuleNetAllow, `"debian.org:80" is not within`},
		{"outside: a wider range", idNet, limit("203.0.0.0/16:80"), nil, nil, nil, RuleNetAllow, `"203.0.0.0/16:80"`},
		{"outside: a name for an address rule", idNet, limit("203.0.113.7.nip.test:80"), nil, nil, nil, RuleNetAllow, "not within"},
		{"malformed", idNet, limit("repo.test"), nil, nil, nil, RuleNetAllow, `network rule "repo.test": want host:port`},
		{"too many", idNet, limit(make([]string, MaxNetRules+1)...), nil, nil, nil, "", "65 network rules; the limit is 64"},
		{"too long", idNet, limit(strings.Repeat("a", MaxNetRuleBytes+1)), nil, nil, nil, "", "network rule 0 is 301 bytes"},
		{"the lock", idNet, nil, limit("repo.test:*"), []string{"repo.test:80", "repo.test:443"}, []string{NarrowedByLock}, "", ""},
		{"the lock meets a wildcard", idNet, nil, limit("*.debian.org:*"), []string{"*.debian.org:80"}, []string{NarrowedByLock}, "", ""},
		{"locked to nothing", idNet, nil, limit(), []string{}, []string{NarrowedByLock}, "", ""},
		{"a subset of the lock", idNet, limit("repo.test:443"), limit("repo.test:*"), []string{"repo.test:443"},
			[]string{NarrowedByRequest, NarrowedByLock}, "", ""},
		{"outside the lock", idNet, limit("repo.test:80"), limit("repo.test:443"), nil, nil, RuleNetLock,
			`network rule "repo.test:80" is not within the session's network lock (repo.test:443)`},
		{"outside the lock to nothing", idNet, limit("repo.test:80"), limit(), nil, nil, RuleNetLock, "network lock (nothing)"},
		{"outside the profile and the lock", idNet, limit("evil.test:80"), limit("repo.test:80"), nil, nil, RuleNetAllow, "network.allow"},
		{"a damaged lock allows nothing", idNet, nil, limit("not a rule"), []string{}, []string{NarrowedByLock}, "", ""},
		{"no network to narrow", idOffline, limit(), nil, nil, nil, "", ""},
		{"no network to allow", idOffline, limit("repo.test:80"), nil, nil, nil, RuleNetAllow, "the profile has no network"},
		{"a lock without a network", idOffline, nil, limit(), nil, nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := Request{Argv: argv("true"), Session: "s", Net: tt.net, NetLock: tt.lock}
			v := p.Decide(tt.id, req)
			checkVerdict(t, p, req, v)
			if tt.reason != "" {
				if v.Allowed || v.Rule != tt.rule || !strings.Contains(v.Reason, tt.reason) {
					t.Fatalf("want a refusal by %q with %q, got %+v", tt.rule, tt.reason, v)
				}
				return
			}
			if !v.Allowed {
				t.Fatalf("refused: %v", v.Err())
			}
			if got := ruleTexts(v.Network); !reflect.DeepEqual(got, tt.rules) {
				t.Errorf("rules %q, want %q", got, tt.rules)
			}
			if !reflect.DeepEqual(v.NetNarrowed, tt.narrowed) {
				t.Errorf("narrowed by %q, want %q", v.NetNarrowed, tt.narrowed)
			}
			if v.Network != nil && v.Network.MaxConns != 7 {
				t.Errorf("the narrowed network lost the profile's limits: %+v", v.Network)
			}
		})
	}
	// The profile's own verdict is not changed by a narrowed one.
	p.Decide(idNet, Request{Argv: argv("true"), Net: limit()})
	if got := ruleTexts(p.Decide(idNet, Request{Argv: argv("true")}).Network); !reflect.DeepEqual(got, profile) {
		t.Errorf("after a narrowed request, the profile's rules are %q", got)
	}
}

func TestDecideNetLock(t *testing.T) {
	p := mustParse(t, "net.toml", netTOML)
	tests := []struct {
		name       string
		id         Identity
		old        *NetLimit
		want       NetLimit
		rules      []string
		rule, deny string
	}{
		{"to nothing", idNet, nil, NetLimit{}, []string{}, "", ""},
		{"to a subset", idNet, nil, NetLimit{Allow: []string{"repo.test:443", "deb.debian.org:80"}}, []string{"deb.debian.org:80", "repo.test:443"}, "", ""}, // in the profile's order
		{"narrower still", idNet, limit("repo.test:*"), NetLimit{Allow: []string{"repo.test:443"}}, []string{"repo.test:443"}, "", ""},
		{"the same again", idNet, limit("repo.test:443"), NetLimit{Allow: []string{"repo.test:443"}}, []string{"repo.test:443"}, "", ""},
		{"wider than the lock", idNet, limit("repo.test:443"), NetLimit{Allow: []string{"repo.test:80"}}, nil, RuleNetLock, `"repo.test:80" is not within the session's network lock`},
		{"wider after nothing", idNet, limit(), NetLimit{Allow: []string{"repo.test:80"}}, nil, RuleNetLock, "network lock (nothing)"},
		{"outside the profile", idNet, nil, NetLimit{Allow: []string{"evil.test:443"}}, nil, RuleNetAllow, `"evil.test:443" is not within the profile's network.allow`},
		{"malformed", idNet, nil, NetLimit{Allow: []string{"x:y"}}, nil, RuleNetAllow, `network rule "x:y"`},
		{"no network, locked to nothing", idOffline, nil, NetLimit{}, nil, "", ""},
		{"no network, a rule", idOffline, nil, NetLimit{Allow: []string{"repo.test:80"}}, nil, RuleNetAllow, "the profile has no network"},
		{"no profile", Identity{UID: 7, User: "x"}, nil, NetLimit{}, nil, "", "no policy profile matches"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := p.DecideNetLock(tt.id, "", tt.old, tt.want)
			if tt.deny != "" {
				if v.Allowed || v.Rule != tt.rule || !strings.Contains(v.Reason, tt.deny) || v.Network != nil {
					t.Fatalf("want a refusal by %q with %q, got %+v", tt.rule, tt.deny, v)
				}
				return
			}
			if !v.Allowed || v.Rule != "network lock" || !strings.Contains(v.Reason, "locked to") {
				t.Fatalf("refused: %+v", v)
			}
			if got := ruleTexts(v.Network); !reflect.DeepEqual(got, tt.rules) {
				t.Errorf("rules %q, want %q", got, tt.rules)
			}
		})
	}
	if v := mustParse(t, "n.toml", strings.Replace(netTOML, "sessions = { allowed = true }", "", 1)).DecideNetLock(idNet, "", nil, NetLimit{}); v.Allowed {
		t.Errorf("locked a session of a profile without sessions: %+v", v)
	}
}

// FuzzDecideNet checks narrowing on any rules: the verdict's network is
// within the profile's and the lock's, never wider.
func FuzzDecideNet(f *testing.F) {
	f.Add("repo.test:80", true, "repo.test:*", true, uint32(1000))
	f.Add("", true, "", false, uint32(1000))
	f.Add("evil.test:80\x1erepo.test:80", true, "", false, uint32(1000))
	f.Add("203.0.113.7:9", true, "203.0.113.0/25:*\x1e*.debian.org:*", true, uint32(1000))
	f.Add("repo.test:80", true, "", true, uint32(1001))
	p := mustParse(f, "net.toml", netTOML)
	split := func(s string, on bool) *NetLimit {
		if !on {
			return nil
		}
		if s == "" {
			return &NetLimit{}
		}
		return &NetLimit{Allow: strings.Split(s, "\x1e")}
	}
	f.Fuzz(func(t *testing.T, netS string, netOn bool, lockS string, lockOn bool, uid uint32) {
		req := Request{Argv: argv("true"), Session: "s", Net: split(netS, netOn), NetLock: split(lockS, lockOn)}
		id := Identity{UID: uid, User: "u"}
		v := p.Decide(id, req)
		checkVerdict(t, p, req, v)
		if again := p.Decide(id, req); !reflect.DeepEqual(v, again) {
			t.Fatalf("Decide is not deterministic: %+v then %+v", v, again)
		}
		if !v.Allowed || v.Network == nil || req.NetLock == nil {
			return
		}
		prof, _ := p.profileFor(id)
		locked, _ := netrule.ParseRules(req.NetLock.Allow)
		allowed := prof.net.Rules.Intersect(locked)
		for _, r := range v.Network.Rules {
			if _, ok := allowed.Covering(r); !ok {
				t.Fatalf("network rule %s is not within the profile under the lock %q", r.Text, req.NetLock.Allow)
			}
		}
	})
}

// TestSessionNetwork: a session's network between commands is its
// profile's, narrowed by its lock and its last command's limit, each by
// intersection: a rule that is no longer within the profile (a reload took
// it away) never widens it.
func TestSessionNetwork(t *testing.T) {
	p := mustParse(t, "net.toml", netTOML)
	profile := []string{"*.debian.org:80", "repo.test:80", "repo.test:443", "203.0.113.0/24:*"}
	for _, tc := range []struct {
		name       string
		id         Identity
		lock, last *NetLimit
		rules      []string
		narrowed   []string
	}{
		{"the profile's", idNet, nil, nil, profile, nil},
		{"locked", idNet, limit("repo.test:443"), nil, []string{"repo.test:443"}, []string{NarrowedByLock}},
		{"its last command's", idNet, nil, limit("deb.debian.org:80"), []string{"deb.debian.org:80"}, []string{NarrowedByRequest}},
		{"both", idNet, limit("repo.test:*"), limit("repo.test:80"), []string{"repo.test:80"}, []string{NarrowedByRequest, NarrowedByLock}},
		{"no longer in the profile", idNet, limit("other.test:80"), nil, []string{}, []string{NarrowedByLock}},
		{"a command that asked for nothing", idNet, nil, limit(), []string{}, []string{NarrowedByRequest}},
		{"no network", idOffline, nil, nil, nil, nil},
		{"no profile", Identity{UID: 4242}, nil, nil, nil, nil},
	} {
		net, narrowed := p.SessionNetwork(tc.id, tc.lock, tc.last)
		if got := ruleTexts(net); !reflect.DeepEqual(got, tc.rules) || !reflect.DeepEqual(narrowed, tc.narrowed) {
			t.Errorf("%s: rules %q narrowed %q, want %q %q", tc.name, got, narrowed, tc.rules, tc.narrowed)
		}
		if net != nil && net.MaxConns != 7 {
			t.Errorf("%s: the profile's other limits are lost: %+v", tc.name, net)
		}
	}
}
