package policy

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// publishTOML has a profile per publishing setting, matched by uid.
const publishTOML = `version = 1
[defaults.network]
mode = "allowlist"
allow = ["deb.debian.org:80"]

[[profile]]
name = "loopback"
match = { uids = [1] }
sessions = { allowed = true, publish = true }

[[profile]]
name = "anywhere"
match = { uids = [2] }
sessions = { allowed = true, publish = true, publish_any_address = true, publish_max_conns = 3 }

[[profile]]
name = "closed"
match = { uids = [3] }
sessions = { allowed = true }

[[profile]]
name = "nosessions"
match = { uids = [4] }
`

func TestDecidePublish(t *testing.T) {
	p := mustParse(t, "publish.toml", publishTOML)
	lo := HostAddr{Addr: netip.MustParseAddrPort("127.0.0.1:8080")}
	lo6 := HostAddr{Addr: netip.MustParseAddrPort("[::1]:8080")}
	mapped := HostAddr{Addr: netip.MustParseAddrPort("[::ffff:127.0.0.2]:8080")}
	sock := HostAddr{Unix: "/tmp/app.sock"}
	anyv4 := HostAddr{Addr: netip.MustParseAddrPort("0.0.0.0:8080")}
	lan := HostAddr{Addr: netip.MustParseAddrPort("192.168.1.5:80")}
	for _, c := range []struct {
		name string
		uid  uint32
		req  PublishRequest
		ok   bool
		rule string // the rule that decided
	}{
		{"loopback", 1, PublishRequest{"web", 8000, lo, ""}, true, "sessions.publish"},
		{"IPv6 loopback", 1, PublishRequest{"web", 8000, lo6, ""}, true, "sessions.publish"},
		{"IPv4-mapped loopback", 1, PublishRequest{"web", 8000, mapped, ""}, true, "sessions.publish"},
		{"Unix socket", 1, PublishRequest{"web", 1, sock, ""}, true, "sessions.publish"},
		{"any address refused", 1, PublishRequest{"web", 8000, anyv4, ""}, false, "sessions.publish_any_address"},
		{"LAN address refused", 1, PublishRequest{"web", 8000, lan, ""}, false, "sessions.publish_any_address"},
		{"any address allowed", 2, PublishRequest{"web", 8000, anyv4, ""}, true, "sessions.publish_any_address"},
		{"loopback where any is allowed", 2, PublishRequest{"web", 65535, lo, ""}, true, "sessions.publish"},
		{"publishing not allowed", 3, PublishRequest{"web", 8000, lo, ""}, false, "sessions.publish"},
		{"sessions not allowed", 4, PublishRequest{"web", 8000, lo, ""}, false, "sessions.allowed"},
		{"guest port 0", 1, PublishRequest{"web", 0, lo, ""}, false, ""},
		{"guest port too big", 1, PublishRequest{"web", 65536, lo, ""}, false, ""},
		{"bad session name", 1, PublishRequest{"../x", 8000, lo, ""}, false, ""},
		{"no host address", 1, PublishRequest{"web", 8000, HostAddr{}, ""}, false, ""},
		{"the session's image", 1, PublishRequest{"web", 8000, lo, "default"}, true, "sessions.publish"},
		{"an image not listed", 1, PublishRequest{"web", 8000, lo, "py"}, false, RuleImages},
	} {
		v := p.DecidePublish(Identity{UID: c.uid}, c.req)
		if v.Allowed != c.ok || v.Rule != c.rule || v.Reason == "" {
			t.Errorf("%s: %+v, want allowed %v by rule %q", c.name, v, c.ok, c.rule)
		}
		if !v.Allowed && (v.Limits != Limits{}) {
			t.Errorf("%s: a denial with limits: %+v", c.name, v)
		}
	}
	if v := p.DecidePublish(Identity{UID: 2}, PublishRequest{"web", 8000, lo, ""}); v.Limits.Publish != (PublishLimits{true, true, 3, builtinPublishIdle}) {
		t.Errorf("limits of an allowed publish: %+v", v.Limits.Publish)
	}
	if v := p.DecidePublish(Identity{UID: 99}, PublishRequest{"web", 8000, lo, ""}); v.Allowed || !strings.Contains(v.Reason, "no policy profile") {
		t.Errorf("no profile: %+v", v)
	}
	if v := (*Policy)(nil).DecidePublish(Identity{UID: 1}, PublishRequest{"web", 8000, lo, ""}); v.Allowed {
		t.Error("a nil policy allowed a publish")
	}
	if v := Default().DecidePublish(Identity{UID: 1000, User: "u"}, PublishRequest{"web", 8000, lo, ""}); v.Allowed {
		t.Errorf("the default policy publishes: %+v", v)
	}
}

// TestPublishSettings: publishing that cannot work is refused when the
// policy is read, with the key and the fix.
func TestPublishSettings(t *testing.T) {
	const head = "version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = true }\n"
	const net = "network = { mode = \"allowlist\", allow = [\"a.test:80\"] }\n"
	for _, c := range []struct{ name, src, want string }{
		{"no NIC", head + "sessions = { allowed = true, publish = true }\n", `sessions.publish = true needs network.mode = "allowlist"`},
		{"no sessions", head + net + "sessions = { publish = true }\n", "sessions.publish = true needs sessions.allowed = true"},
		{"any address alone", head + net + "sessions = { allowed = true, publish_any_address = true }\n", "publish_any_address = true without sessions.publish = true"},
		{"no connections", head + net + "sessions = { allowed = true, publish = true, publish_max_conns = 0 }\n", "sessions.publish_max_conns"},
		{"too many connections", head + net + "sessions = { allowed = true, publish = true, publish_max_conns = 1025 }\n", "sessions.publish_max_conns"},
		{"from defaults without a NIC", "version = 1\n[defaults.sessions]\nallowed = true\npublish = true\n[[profile]]\nname = \"p\"\nmatch = { any = true }\n", `profile "p": sessions.publish = true needs network.mode`},
	} {
		_, err := Parse("x.toml", []byte(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	p := mustParse(t, "ok.toml", head+net+"sessions = { allowed = true, publish = true }\n")
	if got := p.Explain(); !strings.Contains(got, "sessions.publish") {
		t.Errorf("policy check does not list publishing as a relaxation:\n%s", got)
	}
}

func FuzzDecidePublish(f *testing.F) {
	f.Add(uint32(1), "web", 8000, "127.0.0.1:8080", "")
	f.Add(uint32(2), "web", 8000, "0.0.0.0:80", "")
	f.Add(uint32(1), "web", 1, "", "/tmp/a.sock")
	f.Add(uint32(1), "..", -1, "[::ffff:127.0.0.1]:1", "")
	policies := []*Policy{mustParse(f, "publish.toml", publishTOML), Default()}
	f.Fuzz(func(t *testing.T, uid uint32, session string, port int, addr, unix string) {
		req := PublishRequest{Session: session, GuestPort: port, Host: HostAddr{Unix: unix}}
		if a, err := netip.ParseAddrPort(addr); err == nil {
			req.Host.Addr = a
		}
		for _, p := range policies {
			v := p.DecidePublish(Identity{UID: uid}, req)
			if again := p.DecidePublish(Identity{UID: uid}, req); !reflect.DeepEqual(v, again) {
				t.Fatalf("not deterministic: %+v then %+v", v, again)
			}
			if !v.Allowed {
				continue
			}
			if port < 1 || port > 65535 || !v.Limits.Publish.Allowed || v.Limits.Publish.MaxConns < 1 {
				t.Fatalf("allowed %+v: %+v", req, v)
			}
			if !req.Host.loopback() && !v.Limits.Publish.AnyAddress {
				t.Fatalf("allowed a non-loopback address without publish_any_address: %+v", req)
			}
		}
	})
}
