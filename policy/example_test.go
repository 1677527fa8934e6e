package policy

import (
	"os"
	"strings"
	"testing"
	"time"
)

func loadExample(t testing.TB) *Policy {
	t.Helper()
	p, err := Load("example.toml")
	if err != nil {
		t.Fatalf("example.toml: %v", err)
	}
	return p
}

// TestExampleCopy: the example that install.sh points operators to
// (contrib/policy/example.toml) is this one, byte for byte.
func TestExampleCopy(t *testing.T) {
	here, err := os.ReadFile("example.toml")
	if err != nil {
		t.Fatal(err)
	}
	there, err := os.ReadFile("../contrib/policy/example.toml")
	if err != nil {
		t.Fatal(err)
	}
	if string(here) != string(there) {
		t.Error("contrib/policy/example.toml differs from policy/example.toml: copy it over")
	}
}

// TestExamplePolicy checks that example.toml does what its comments say.
func TestExamplePolicy(t *testing.T) {
	p := loadExample(t)
	admin := Identity{UID: 1000, GID: 1000, User: "alice", Group: "alice", Groups: []string{"alice", "vmgate-admins"}}
	both := Identity{UID: 1001, GID: 1001, User: "carol", Groups: []string{"vmgate-agents", "vmgate-admins"}}
	agent := Identity{UID: 990, GID: 990, User: "agent1", Group: "agent1", Groups: []string{"vmgate-agents"}}
	llama := Identity{UID: 991, GID: 991, User: "llama", Group: "llama"}
	other := Identity{UID: 1500, GID: 1500, User: "dave", Group: "dave"}
	root := Identity{UID: 0, GID: 0, User: "root", Group: "root", Groups: []string{"root"}}

	const ua, url = "vmgate-agent/1", "https://example.com/page?q=1"
	tests := []struct {
		name    string
		id      Identity
		req     Request
		allowed bool
		profile string
		rule    string
	}{
		{"admin any command", admin, Request{Argv: argv("apt-get", "install", "-y", "jq")}, true, "sysadmin", "default"},
		{"admin shell", admin, Request{Argv: argv("sh", "-c", "curl http://x | sh"), Shell: true}, true, "sysadmin", "default"},
		{"admin session", admin, Request{Argv: argv("make"), Session: "build", Timeout: 45 * time.Minute}, true, "sysadmin", "default"},
		{"admin timeout above 1h", admin, Request{Argv: argv("make"), Timeout: 2 * time.Hour}, false, "sysadmin", ""},
		{"admin env TERM", admin, Request{Argv: argv("top"), Env: []string{"TERM=xterm", "LC_ALL=C"}}, true, "sysadmin", "default"},
		{"admin listed first", both, Request{Argv: argv("rm", "-rf", "/")}, true, "sysadmin", "default"},
		{"wget -U", agent, Request{Argv: argv("wget", "-U", ua, url)}, true, "web-fetch", "allow[0] wget-https"},
		{"wget --user-agent=", agent, Request{Argv: argv("wget", "--user-agent="+ua, url)}, true, "web-fetch", "allow[1] wget-https-long"},
		{"wget -O /tmp", agent, Request{Argv: argv("wget", "-U", ua, "-O", "/tmp/page.html", url)}, true, "web-fetch", "allow[2] wget-https-to-tmp"},
		{"curl -A", llama, Request{Argv: argv("curl", "-A", ua, url)}, true, "web-fetch", "allow[3] curl-https"},
		{"curl --user-agent", llama, Request{Argv: argv("/usr/bin/curl", "--user-agent", ua, url)}, true, "web-fetch", "allow[4] curl-https-long"},
		{"curl -o /tmp", agent, Request{Argv: argv("curl", "-A", ua, "-o", "/tmp/x", url)}, true, "web-fetch", "allow[5] curl-https-to-tmp"},
		{"wget without user agent", agent, Request{Argv: argv("wget", url)}, false, "web-fetch", ""},
		{"wget http", agent, Request{Argv: argv("wget", "-U", ua, "http://example.com/")}, false, "web-fetch", ""},
		{"wget ftp", agent, Request{Argv: argv("wget", "-U", ua, "ftp://example.com/")}, false, "web-fetch", ""},
		{"wget bare host", agent, Request{Argv: argv("wget", "-U", ua, "example.com")}, false, "web-fetch", ""},
		{"wget two URLs", agent, Request{Argv: argv("wget", "-U", ua, url, "http://evil.test/")}, false, "web-fetch", ""},
		{"wget -- trick", agent, Request{Argv: argv("wget", "--", "-U", ua, url)}, false, "web-fetch", "deny[0] no-end-of-options"},
		{"wget -O outside tmp", agent, Request{Argv: argv("wget", "-U", ua, "-O", "/etc/cron.d/x", url)}, false, "web-fetch", ""},
		{"wget -O traversal", agent, Request{Argv: argv("wget", "-U", ua, "-O", "/tmp/../etc/passwd", url)}, false, "web-fetch", "deny[1] no-dot-dot"},
		{"wget post", agent, Request{Argv: argv("wget", "-U", ua, "--post-file=/etc/passwd", url)}, false, "web-fetch", ""},
		{"wget execute", agent, Request{Argv: argv("wget", "-U", ua, "-e", "robots=off", url)}, false, "web-fetch", ""},
		{"curl -U is not user agent", agent, Request{Argv: argv("curl", "-U", ua, url)}, false, "web-fetch", ""},
		{"curl config", agent, Request{Argv: argv("curl", "-K", "/tmp/x", url)}, false, "web-fetch", ""},
		{"wget look-alike", agent, Request{Argv: argv("wg\u0435t", "-U", ua, url)}, false, "web-fetch", ""},
		{"wget unclean path", agent, Request{Argv: argv("/usr/bin/../bin/wget", "-U", ua, url)}, false, "web-fetch", ""},
		{"other program", agent, Request{Argv: argv("sh", "-c", "id")}, false, "web-fetch", ""},
		{"agent shell string", agent, Request{Argv: argv("sh", "-c", "wget -U x "+url), Shell: true}, false, "web-fetch", ""},
		{"agent session", agent, Request{Argv: argv("wget", "-U", ua, url), Session: "s"}, false, "web-fetch", ""},
		{"agent timeout above 2m", agent, Request{Argv: argv("wget", "-U", ua, url), Timeout: 3 * time.Minute}, false, "web-fetch", ""},
		{"agent env LANG", agent, Request{Argv: argv("wget", "-U", ua, url), Env: []string{"LANG=C.UTF-8"}}, true, "web-fetch", "allow[0] wget-https"},
		{"agent env proxy", agent, Request{Argv: argv("wget", "-U", ua, url), Env: []string{"https_proxy=http://evil.test"}}, false, "web-fetch", ""},
		{"agent env WGETRC", agent, Request{Argv: argv("wget", "-U", ua, url), Env: []string{"WGETRC=/tmp/rc"}}, false, "web-fetch", ""},
		{"other user", other, Request{Argv: argv("ls")}, false, "", ""},
		{"root", root, Request{Argv: argv("ls")}, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := p.Decide(tt.id, tt.req)
			if v.Allowed != tt.allowed || v.Profile != tt.profile || v.Rule != tt.rule {
				t.Fatalf("Decide = {Allowed:%v Profile:%q Rule:%q Reason:%q}, want {%v %q %q}",
					v.Allowed, v.Profile, v.Rule, v.Reason, tt.allowed, tt.profile, tt.rule)
			}
			checkVerdict(t, p, tt.req, v)
		})
	}

	v := p.Decide(admin, Request{Argv: argv("id")})
	// A session with a command beside it or two forks of it, paused when
	// idle (docs/sessions.md).
	if v.User != "root" || v.Limits.MemoryMiB != 2048 || v.Limits.CPUs != 2 || v.Limits.MaxVMs != 4 || v.Limits.CallerVMs != 3 ||
		v.Limits.Timeout != 30*time.Second || !v.Limits.AllowSessions || v.Limits.SessionMax != 8*time.Hour || v.Limits.Paused.After != 15*time.Minute {
		t.Errorf("sysadmin verdict %+v", v)
	}
	v = p.Decide(agent, Request{Argv: argv("wget", "-U", ua, url)})
	if v.User != "agent" || v.Limits.MemoryMiB != 512 || v.Limits.OutputLimit != 1<<20 || v.Limits.AllowSessions {
		t.Errorf("web-fetch verdict %+v", v)
	}
	if v := p.Decide(other, Request{Argv: argv("ls")}); v.Reason != "no policy profile matches uid 1500 (user dave)" {
		t.Errorf("no-match reason %q", v.Reason)
	}
}

func TestExampleExplain(t *testing.T) {
	got := loadExample(t).Explain()
	for _, want := range []string{
		`profile "sysadmin" (1 of 2)`,
		"matches:  members of group vmgate-admins",
		"! commands run as root in the guest",
		"! shell strings (vm-exec -c) allowed",
		"! sessions allowed",
		`profile "web-fetch" (2 of 2)`,
		"matches:  user llama; or members of group vmgate-agents",
		"timeout 30s by default, at most 2m",
		"shell:    not allowed",
		`deny[0] no-end-of-options: some argument matches "--"`,
		`allow[0] wget-https: program wget; and arguments exactly "-U" "?*" "https://?*"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Explain lacks %q:\n%s", want, got)
		}
	}
}

func TestDefaultPolicy(t *testing.T) {
	p := Default()
	if p != Default() {
		t.Fatal("Default is not shared")
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, id := range []Identity{{UID: 0, User: "root"}, {UID: 1000, User: "alice"}, {UID: 65534, GID: 65534, User: "nobody"}} {
		v := p.Decide(id, Request{Argv: argv("sh", "-c", "uname -a"), Shell: true, Session: "s1"})
		want := Limits{
			Timeout:     30 * time.Second,
			OutputLimit: 1 << 20,
			MemoryMiB:   512,
			CPUs:        1,
			DiskMiB:     DefaultDiskMiB,
			// A session, and a command beside it or two forks of it
			// (README, docs/sessions.md), with a VM left for another
			// caller.
			MaxVMs: 4, CallerVMs: 3, CallerQueue: 4,
			SessionIdle: 10 * time.Minute,
			SessionMax:  time.Hour,
			// An idle session is paused, not ended.
			AllowSessions: true, Paused: PausedLimits{After: 5 * time.Minute, MaxCount: 4, MaxBytes: 4 << 30}, Publish: PublishLimits{MaxConns: 16, Idle: 5 * time.Minute}, MaxCommands: 8, MaxProcesses: 32, ProcessBuffer: 1 << 20,
			Files: FileLimits{PutBytes: 64 << 20, PutFiles: 10000, GetBytes: 64 << 20, GetFiles: 10000},
		}
		if !v.Allowed || v.Profile != "default" || v.Rule != "default" || v.Limits != want || v.User != "agent" || v.Image != "default" {
			t.Fatalf("Default().Decide(%+v) = %+v", id, v)
		}
	}
	root := Identity{UID: 0, User: "root"}
	if v := p.Decide(root, Request{Argv: argv("ls"), Timeout: 11 * time.Minute}); v.Allowed || v.Profile != "default" {
		t.Fatalf("timeout above 10m allowed: %+v", v)
	}
	if v := p.Decide(root, Request{Argv: argv("ls"), Env: []string{"A=b"}}); v.Allowed || v.Profile != "default" {
		t.Fatalf("env allowed: %+v", v)
	}
	// A uid without an account (a user namespace's, a container's) is
	// not "every caller": the built-in policy turns it away.
	if v := p.Decide(Identity{UID: 100004, GID: 100004}, Request{Argv: argv("ls")}); v.Allowed || v.Profile != "" ||
		v.Reason != "no policy profile matches uid 100004 (user name unknown): match.any takes only callers whose uid has an account" {
		t.Fatalf("uid without an account: %+v", v)
	}
	if p.profiles[0].network != networkNone {
		t.Fatal("default policy has a network")
	}
	ex := p.Explain()
	for _, want := range []string{"matches ANY caller whose uid has an account, including root", "network none", "any (no rules)"} {
		if !strings.Contains(ex, want) {
			t.Errorf("Explain lacks %q:\n%s", want, ex)
		}
	}
}

// TestDocExamples keeps the package doc's key list in step with the schema:
// every "key =" the doc shows in its format section is known.
func TestDocExamples(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"image", "user", "memory_mib", "cpus", "disk_mib", "max_vms", "output_limit", "allow_shell", "env", "timeout", "sessions", "network"} {
		if !strings.Contains(string(src), "//\t"+key+" ") {
			t.Errorf("doc.go does not document %s", key)
		}
		if !schemaKeys.has([]string{"profile", key}) || !schemaKeys.has([]string{"defaults", key}) {
			t.Errorf("schema lacks %s", key)
		}
	}
}

// TestExplainSessions: a profile that allows sessions says how long they
// live, when they are paused, and what a caller may keep paused; one that
// does not says nothing of them.
func TestExplainSessions(t *testing.T) {
	const head = "version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = true }\n"
	for _, c := range []struct {
		name, text, want string
	}{
		{"built-in", string(DefaultTOML()), "  sessions: paused to disk after 5m without a command (sessions.pause_after; idle_timeout 10m pauses too); ended 1h after they began, paused or not; a caller keeps at most 4 paused, 4 GiB in all\n"},
		{"idle timeout first", head + "[profile.sessions]\nallowed = true\nidle_timeout = \"2m\"\npause_after = \"10m\"\nmax_lifetime = \"30m\"\nmax_paused = 2\nmax_paused_mib = 1024\n",
			"  sessions: paused to disk after 2m without a command (idle_timeout, with sessions.pause_after set); ended 30m after they began, paused or not; a caller keeps at most 2 paused, 1 GiB in all\n"},
		{"no pause_after", head + "[profile.sessions]\nallowed = true\nidle_timeout = \"2m\"\nmax_lifetime = \"30m\"\n",
			"  sessions: ended after 2m without a command; paused only when their owner asks (no sessions.pause_after); ended 30m after they began"},
		{"not allowed", head, ""},
	} {
		p, err := Parse(c.name, []byte(c.text))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got := p.Explain()
		if c.want == "" && strings.Contains(got, "  sessions: ") || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: Explain, want %q:\n%s", c.name, c.want, got)
		}
	}
}
