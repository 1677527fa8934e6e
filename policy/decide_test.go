package policy

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// decideTOML exercises every kind of match and rule. Profile order matters:
// "admins" comes first so that a caller in both admins and by-uid gets it.
const decideTOML = `
version = 1

[defaults]
timeout = { default = "30s", max = "10m" }

[[profile]]
name = "admins"
match = { groups = ["wheel"] }
user = "root"
images = ["default", "py"]
allow_shell = true
sessions = { allowed = true, idle_timeout = "5m", max_lifetime = "2h" }
env = ["LANG", "LC_*"]
memory_mib = 1024
cpus = 2
disk_mib = 2048

[[profile]]
name = "by-uid"
match = { uids = [1001] }
output_limit = "64KiB"
  [[profile.deny]]
  name = "no-rm"
  program = ["rm"]
  [[profile.deny]]
  name = "no-upload"
  args_any = ["--post-file*", "--post-data*"]
  [[profile.deny]]
  args_regex = '(^| )--config( |=|$)'

[[profile]]
name = "fetch"
match = { users = ["fetcher"], gids = [2000] }
  [[profile.deny]]
  name = "no-end-of-options"
  args_any = ["--"]
  [[profile.allow]]
  name = "wget-ua"
  program = ["wget"]
  args = ["-U", "?*", "https://?*"]
  [[profile.allow]]
  name = "abs-ls"
  program = ["/bin/ls"]
  args = ["..."]
  [[profile.allow]]
  name = "echo-hello"
  program = ["echo"]
  args = ["hello", "**"]
  [[profile.allow]]
  name = "true-bare"
  program = ["true"]
  args = []
  [[profile.allow]]
  name = "printf-any"
  program = ["printf"]
  args = ["..."]
`

func mustParse(t testing.TB, name, src string) *Policy {
	t.Helper()
	p, err := Parse(name, []byte(src))
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return p
}

var (
	idAdmin   = Identity{UID: 1000, GID: 1000, PID: 42, User: "alice", Group: "alice", Groups: []string{"alice", "wheel"}}
	idUID     = Identity{UID: 1001, GID: 1001, User: "bob", Group: "bob"}
	idFetcher = Identity{UID: 1002, GID: 1002, User: "fetcher", Group: "fetcher"}
	idGID     = Identity{UID: 1003, GID: 2000, User: "", Group: ""}
)

func argv(a ...string) []string { return a }

func TestDecide(t *testing.T) {
	p := mustParse(t, "decide.toml", decideTOML)
	big := strings.Repeat("a", MaxArgBytes+1)
	hundredK := strings.Repeat("b", 100<<10)
	many := make([]string, MaxArgs+1)
	for i := range many {
		many[i] = "x"
	}
	many[0] = "echo"
	manyEnv := make([]string, MaxEnv+1)
	for i := range manyEnv {
		manyEnv[i] = "LANG=C"
	}

	tests := []struct {
		name    string
		id      Identity
		req     Request
		allowed bool
		profile string
		rule    string
		reason  string // substring of Reason
	}{
		// Profile selection.
		{"admin by supplementary group", idAdmin, Request{Argv: argv("ls", "-la")}, true, "admins", "default", "no allow rules"},
		{"group by primary group name", Identity{UID: 5, GID: 10, Group: "wheel"}, Request{Argv: argv("id")}, true, "admins", "default", ""},
		{"first profile wins", Identity{UID: 1001, Groups: []string{"wheel"}}, Request{Argv: argv("rm", "x")}, true, "admins", "default", ""},
		{"uid match", idUID, Request{Argv: argv("ls")}, true, "by-uid", "default", ""},
		{"user name match", idFetcher, Request{Argv: argv("wget", "-U", "x", "https://example.com/a")}, true, "fetch", "allow[0] wget-ua", "allowed by allow[0] wget-ua"},
		{"gid match without names", idGID, Request{Argv: argv("wget", "-U", "x", "https://example.com/")}, true, "fetch", "allow[0] wget-ua", ""},
		{"no match", Identity{UID: 4242, GID: 4242, User: "mallory"}, Request{Argv: argv("ls")}, false, "", "", "no policy profile matches uid 4242 (user mallory)"},
		{"no match unknown user", Identity{UID: 4243}, Request{Argv: argv("ls")}, false, "", "", "no policy profile matches uid 4243 (user name unknown)"},
		{"no match names the subordinate uid", Identity{UID: 4242, User: "mallory", SubUID: 300000}, Request{Argv: argv("ls")}, false, "", "",
			"no policy profile matches uid 4242 (user mallory, as its subordinate uid 300000)"},
		{"subordinate uid matches as its login", Identity{UID: 1001, GID: 1001, User: "bob", Group: "bob", SubUID: 165536}, Request{Argv: argv("ls")}, true, "by-uid", "default", ""},
		{"root is not special", Identity{UID: 0, GID: 0, User: "root", Group: "root"}, Request{Argv: argv("ls")}, false, "", "", "uid 0 (user root)"},
		{"user name is not a group name", Identity{UID: 7, User: "wheel"}, Request{Argv: argv("ls")}, false, "", "", "no policy profile"},

		// Deny rules, deny first.
		{"deny by program", idUID, Request{Argv: argv("rm", "-rf", "/")}, false, "by-uid", "deny[0] no-rm", "argv matches deny rule"},
		{"deny by program basename", idUID, Request{Argv: argv("/bin/rm", "x")}, false, "by-uid", "deny[0] no-rm", ""},
		{"deny args_any across slash", idUID, Request{Argv: argv("wget", "--post-file=/etc/passwd", "https://x")}, false, "by-uid", "deny[1] no-upload", `argument 1 "--post-file=/etc/passwd" matches "--post-file*"`},
		{"deny args_any later argument", idUID, Request{Argv: argv("curl", "https://x", "--post-data", "a")}, false, "by-uid", "deny[1] no-upload", "argument 2"},
		{"deny unnamed regex rule", idUID, Request{Argv: argv("wget", "--config=/tmp/x", "https://x")}, false, "by-uid", "deny[2]", ""},
		{"deny regex at end", idUID, Request{Argv: argv("wget", "--config")}, false, "by-uid", "deny[2]", ""},
		{"regex does not match substring", idUID, Request{Argv: argv("wget", "--configure")}, true, "by-uid", "default", ""},
		{"deny-first beats allow", idFetcher, Request{Argv: argv("printf", "--", "x")}, false, "fetch", "deny[0] no-end-of-options", ""},
		{"allow printf without --", idFetcher, Request{Argv: argv("printf", "%s", "x")}, true, "fetch", "allow[4] printf-any", ""},

		// Allow rules and argument shapes.
		{"dashdash trick", idFetcher, Request{Argv: argv("wget", "--", "-U", "x", "https://a")}, false, "fetch", "deny[0] no-end-of-options", `argument 1 "--"`},
		{"missing user agent", idFetcher, Request{Argv: argv("wget", "https://example.com")}, false, "fetch", "", "no allow rule matches"},
		{"http not https", idFetcher, Request{Argv: argv("wget", "-U", "x", "http://example.com")}, false, "fetch", "", "no allow rule matches"},
		{"extra argument", idFetcher, Request{Argv: argv("wget", "-U", "x", "https://a", "-O/etc/x")}, false, "fetch", "", "no allow rule matches"},
		{"empty user agent", idFetcher, Request{Argv: argv("wget", "-U", "", "https://a")}, false, "fetch", "", "no allow rule matches"},
		{"absolute path matches bare pattern", idFetcher, Request{Argv: argv("/usr/bin/wget", "-U", "x", "https://a")}, true, "fetch", "allow[0] wget-ua", ""},
		{"absolute pattern needs absolute argv0", idFetcher, Request{Argv: argv("ls", "/")}, false, "fetch", "", "no allow rule matches"},
		{"absolute pattern exact", idFetcher, Request{Argv: argv("/bin/ls", "-l", "/tmp")}, true, "fetch", "allow[1] abs-ls", ""},
		{"other absolute path", idFetcher, Request{Argv: argv("/usr/bin/ls", "/")}, false, "fetch", "", "no allow rule matches"},
		{"rest marker with no rest", idFetcher, Request{Argv: argv("echo", "hello")}, true, "fetch", "allow[2] echo-hello", ""},
		{"rest marker with rest", idFetcher, Request{Argv: argv("echo", "hello", "a", "b")}, true, "fetch", "allow[2] echo-hello", ""},
		{"argv shorter than patterns", idFetcher, Request{Argv: argv("echo")}, false, "fetch", "", "no allow rule matches"},
		{"empty args means none", idFetcher, Request{Argv: argv("true")}, true, "fetch", "allow[3] true-bare", ""},
		{"empty args rejects one", idFetcher, Request{Argv: argv("true", "x")}, false, "fetch", "", "no allow rule matches"},
		{"cyrillic look-alike", idFetcher, Request{Argv: argv("wg\u0435t", "-U", "x", "https://a")}, false, "fetch", "", "no allow rule matches"},
		{"cyrillic look-alike escapes deny", idUID, Request{Argv: argv("\u0433m", "x")}, true, "by-uid", "default", ""},

		// Program names.
		{"dotdot in absolute path", idFetcher, Request{Argv: argv("/usr/bin/../bin/wget", "-U", "x", "https://a")}, false, "fetch", "", "not clean"},
		{"relative traversal", idAdmin, Request{Argv: argv("../../bin/sh")}, false, "admins", "", "relative path"},
		{"dot slash", idAdmin, Request{Argv: argv("./wget")}, false, "admins", "", "relative path"},
		{"relative with slash", idAdmin, Request{Argv: argv("bin/sh")}, false, "admins", "", "relative path"},
		{"double slash", idAdmin, Request{Argv: argv("//bin/sh")}, false, "admins", "", "not clean"},
		{"trailing slash", idAdmin, Request{Argv: argv("/usr/bin/")}, false, "admins", "", "ends with a slash"},
		{"root dir", idAdmin, Request{Argv: argv("/")}, false, "admins", "", "ends with a slash"},
		{"empty program", idAdmin, Request{Argv: argv("", "x")}, false, "admins", "", "empty program name"},
		{"whitespace program", idAdmin, Request{Argv: argv("   ")}, false, "admins", "", "white space"},
		{"program with trailing space", idAdmin, Request{Argv: argv("ls ")}, false, "admins", "", "white space"},
		{"zero-width space", idAdmin, Request{Argv: argv("w\u200bget")}, false, "admins", "", "invisible"},
		{"invalid utf8 program", idAdmin, Request{Argv: argv("\xffls")}, false, "admins", "", "UTF-8"},
		{"dot program", idAdmin, Request{Argv: argv(".")}, false, "admins", "", "not a program name"},
		{"dotdot program", idAdmin, Request{Argv: argv("..")}, false, "admins", "", "not a program name"},

		// Request shape.
		{"empty argv", idAdmin, Request{Argv: []string{}}, false, "admins", "", "empty argv"},
		{"nil argv", idAdmin, Request{}, false, "admins", "", "empty argv"},
		{"NUL in program", idAdmin, Request{Argv: argv("ls\x00", "-l")}, false, "admins", "", "argument 0 contains a NUL"},
		{"NUL in argument", idFetcher, Request{Argv: argv("wget", "-U", "a\x00b", "https://a")}, false, "fetch", "", "argument 2 contains a NUL"},
		{"too many args", idAdmin, Request{Argv: many}, false, "admins", "", "4097 elements"},
		{"huge argument", idAdmin, Request{Argv: argv("echo", big)}, false, "admins", "", "argument 1 is 131073 bytes"},
		{"huge total", idAdmin, Request{Argv: argv("echo", hundredK, hundredK, hundredK)}, false, "admins", "", "total"},
		{"huge env entry", idAdmin, Request{Argv: argv("ls"), Env: []string{"LANG=" + big}}, false, "admins", "", "environment entry 0 is"},
		{"too many env", idAdmin, Request{Argv: argv("ls"), Env: manyEnv}, false, "admins", "", "257 entries"},

		// Environment.
		{"env allowed", idAdmin, Request{Argv: argv("ls"), Env: []string{"LANG=C.UTF-8"}}, true, "admins", "default", ""},
		{"env prefix allowed", idAdmin, Request{Argv: argv("ls"), Env: []string{"LC_ALL=C", "LANG=C"}}, true, "admins", "default", ""},
		{"env not allowed", idAdmin, Request{Argv: argv("ls"), Env: []string{"LANG=C", "LD_PRELOAD=/x.so"}}, false, "admins", "", `environment variable "LD_PRELOAD" is not allowed (allowed: LANG, LC_*)`},
		{"env none allowed", idUID, Request{Argv: argv("ls"), Env: []string{"LANG=C"}}, false, "by-uid", "", "(allowed: none)"},
		{"env without equals", idAdmin, Request{Argv: argv("ls"), Env: []string{"LANG"}}, false, "admins", "", "not KEY=VALUE"},
		{"env empty name", idAdmin, Request{Argv: argv("ls"), Env: []string{"=x"}}, false, "admins", "", "empty name"},
		{"env NUL in value", idAdmin, Request{Argv: argv("ls"), Env: []string{"LANG=a\x00b"}}, false, "admins", "", "NUL"},
		{"env twice", idAdmin, Request{Argv: argv("ls"), Env: []string{"LANG=C", "LANG=D"}}, false, "admins", "", "given twice"},
		{"env prefix is not a name", idAdmin, Request{Argv: argv("ls"), Env: []string{"LC=x"}}, false, "admins", "", "not allowed"},

		// Timeouts.
		{"timeout default", idAdmin, Request{Argv: argv("ls")}, true, "admins", "default", ""},
		{"timeout within max", idAdmin, Request{Argv: argv("ls"), Timeout: 5 * time.Minute}, true, "admins", "default", ""},
		{"timeout at max", idAdmin, Request{Argv: argv("ls"), Timeout: 10 * time.Minute}, true, "admins", "default", ""},
		{"timeout above max", idAdmin, Request{Argv: argv("ls"), Timeout: 11 * time.Minute}, false, "admins", "", "requested timeout 11m exceeds the maximum 10m"},
		{"timeout negative", idAdmin, Request{Argv: argv("ls"), Timeout: -time.Second}, false, "admins", "", "must not be negative"},

		// Shell strings.
		{"shell allowed", idAdmin, Request{Argv: argv("sh", "-c", "ls | wc -l"), Shell: true}, true, "admins", "default", ""},
		{"shell disallowed", idUID, Request{Argv: argv("sh", "-c", "ls"), Shell: true}, false, "by-uid", "", "shell strings (vm-exec -c) are not allowed"},
		{"shell malformed", idAdmin, Request{Argv: argv("bash", "-c", "ls"), Shell: true}, false, "admins", "", "malformed shell request"},
		{"shell missing string", idAdmin, Request{Argv: argv("sh", "-c"), Shell: true}, false, "admins", "", "malformed shell request"},
		{"shell NUL", idAdmin, Request{Argv: argv("sh", "-c", "ls\x00rm"), Shell: true}, false, "admins", "", "NUL"},
		{"shell must pass allow rules", idFetcher, Request{Argv: argv("sh", "-c", "ls"), Shell: true}, false, "fetch", "", "not allowed"},

		// Sessions.
		{"session allowed", idAdmin, Request{Argv: argv("ls"), Session: "work-1.a_b"}, true, "admins", "default", ""},
		{"session disallowed", idUID, Request{Argv: argv("ls"), Session: "s"}, false, "by-uid", "", "sessions are not allowed"},
		{"session traversal", idAdmin, Request{Argv: argv("ls"), Session: "../x"}, false, "admins", "", "session name"},
		{"session dotdot", idAdmin, Request{Argv: argv("ls"), Session: ".."}, false, "admins", "", "session name"},
		{"session too long", idAdmin, Request{Argv: argv("ls"), Session: strings.Repeat("s", 65)}, false, "admins", "", "session name"},
		{"session space", idAdmin, Request{Argv: argv("ls"), Session: "a b"}, false, "admins", "", "session name"},
	}
	if len(tests) < 40 {
		t.Fatalf("only %d cases", len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := p.Decide(tt.id, tt.req)
			if v.Allowed != tt.allowed || v.Profile != tt.profile || v.Rule != tt.rule || !strings.Contains(v.Reason, tt.reason) {
				t.Fatalf("Decide = {Allowed:%v Profile:%q Rule:%q Reason:%q}\nwant     {Allowed:%v Profile:%q Rule:%q Reason:~%q}",
					v.Allowed, v.Profile, v.Rule, v.Reason, tt.allowed, tt.profile, tt.rule, tt.reason)
			}
			checkVerdict(t, p, tt.req, v)
		})
	}
}

// checkVerdict checks the invariants every verdict keeps.
func checkVerdict(t testing.TB, p *Policy, req Request, v Verdict) {
	t.Helper()
	if v.Reason == "" {
		t.Fatalf("verdict without reason: %+v", v)
	}
	if !sanitised(v.Reason) {
		t.Fatalf("reason not printable UTF-8: %q", v.Reason)
	}
	if !v.Allowed {
		if !errors.Is(v.Err(), ErrDenied) {
			t.Fatalf("Err() = %v, want ErrDenied", v.Err())
		}
		if v.Limits != (Limits{}) || v.Env != nil || v.User != "" || v.Image != "" {
			t.Fatalf("denied verdict carries grants: %+v", v)
		}
		return
	}
	if v.Err() != nil {
		t.Fatalf("allowed verdict has Err() = %v", v.Err())
	}
	var prof *profile
	for _, pr := range p.profiles {
		if pr.name == v.Profile {
			prof = pr
			break
		}
	}
	if prof == nil {
		t.Fatalf("allowed by unknown profile %q", v.Profile)
	}
	l := v.Limits
	switch {
	case req.Interactive:
		if l.Timeout != prof.limits.SessionMax || !prof.allowShell || !l.AllowSessions || req.Timeout != 0 {
			t.Fatalf("interactive shell allowed with timeout %s (sessions.max_lifetime %s), shell %v, sessions %v",
				l.Timeout, prof.limits.SessionMax, prof.allowShell, l.AllowSessions)
		}
	case l.Timeout <= 0 || l.Timeout > prof.timeoutMax:
		t.Fatalf("timeout %s outside (0, %s]", l.Timeout, prof.timeoutMax)
	case req.Timeout == 0 && l.Timeout != prof.limits.Timeout:
		t.Fatalf("timeout %s, want default %s", l.Timeout, prof.limits.Timeout)
	}
	want := prof.limits
	want.Timeout = l.Timeout
	if l != want {
		t.Fatalf("limits %+v, want %+v", l, want)
	}
	wantImage := prof.image
	if req.Image != "" {
		wantImage = req.Image
	}
	if v.User != prof.user || v.Image != wantImage || !hasImage(prof.images, v.Image) || v.Rule == "" {
		t.Fatalf("verdict %+v does not match profile %q", v, prof.name)
	}
	if (v.Network == nil) != (prof.net == nil) {
		t.Fatalf("network %+v, the profile's %+v", v.Network, prof.net)
	}
	if v.Network != nil {
		for _, r := range v.Network.Rules {
			if _, ok := prof.net.Rules.Covering(r); !ok {
				t.Fatalf("network rule %s is not within the profile's", r.Text)
			}
		}
	}
	if req.Shell && !prof.allowShell || req.Session != "" && !l.AllowSessions {
		t.Fatalf("allowed shell/session the profile refuses: %+v", v)
	}
	if len(v.Env) != len(req.Env) {
		t.Fatalf("env %q, want %q", v.Env, req.Env)
	}
	for i, e := range v.Env {
		name, _, _ := strings.Cut(e, "=")
		if e != req.Env[i] || !prof.env.allows(name) || strings.IndexByte(e, 0) >= 0 {
			t.Fatalf("env entry %q not from the request or not allowed", e)
		}
	}
	if err := checkProgram(req.Argv[0]); err != nil {
		t.Fatalf("allowed program %q: %v", req.Argv[0], err)
	}
	for _, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			t.Fatalf("allowed argv with NUL: %q", req.Argv)
		}
	}
}

func TestDecideLimits(t *testing.T) {
	p := mustParse(t, "decide.toml", decideTOML)
	v := p.Decide(idAdmin, Request{Argv: argv("ls"), Timeout: 90 * time.Second, Env: []string{"LANG=C"}})
	want := Limits{
		Timeout:     90 * time.Second,
		OutputLimit: 1 << 20,
		MemoryMiB:   1024,
		CPUs:        2,
		DiskMiB:     2048,
		MaxVMs:      2, CallerVMs: 1, CallerQueue: 4,
		SessionIdle:   5 * time.Minute,
		SessionMax:    2 * time.Hour,
		AllowSessions: true, Paused: PausedLimits{MaxCount: 4, MaxBytes: 4 << 30}, Publish: PublishLimits{MaxConns: 16, Idle: 5 * time.Minute}, MaxCommands: 8, MaxProcesses: 32, ProcessBuffer: 1 << 20,
		Files: FileLimits{PutBytes: 64 << 20, PutFiles: 10000, GetBytes: 64 << 20, GetFiles: 10000},
	}
	if !v.Allowed || v.Limits != want || v.User != "root" || v.Image != "default" || len(v.Env) != 1 || v.Env[0] != "LANG=C" {
		t.Fatalf("verdict %+v\nwant limits %+v, user root, image default, env [LANG=C]", v, want)
	}
	v = p.Decide(idUID, Request{Argv: argv("ls")})
	if v.Limits.OutputLimit != 64<<10 || v.Limits.AllowSessions || v.User != "agent" {
		t.Fatalf("by-uid verdict %+v", v)
	}
}

func TestDecideDoesNotAliasRequest(t *testing.T) {
	p := mustParse(t, "decide.toml", decideTOML)
	env := []string{"LANG=C"}
	v := p.Decide(idAdmin, Request{Argv: argv("ls"), Env: env})
	env[0] = "LD_PRELOAD=x"
	if v.Env[0] != "LANG=C" {
		t.Fatalf("verdict env changed with the request: %q", v.Env)
	}
}

func TestVerdictErr(t *testing.T) {
	p := mustParse(t, "decide.toml", decideTOML)
	v := p.Decide(idUID, Request{Argv: argv("rm", "x")})
	err := v.Err()
	if !errors.Is(err, ErrDenied) {
		t.Fatalf("Err() = %v", err)
	}
	const want = `denied by policy: profile "by-uid": deny[0] no-rm: argv matches deny rule`
	if err.Error() != want {
		t.Fatalf("Err() = %q, want %q", err, want)
	}
	v = p.Decide(Identity{UID: 9}, Request{Argv: argv("ls")})
	if got := v.Err().Error(); got != "denied by policy: no policy profile matches uid 9 (user name unknown)" {
		t.Fatalf("Err() = %q", got)
	}
}

func TestDecideNilPolicy(t *testing.T) {
	var p *Policy
	v := p.Decide(idAdmin, Request{Argv: argv("ls")})
	if v.Allowed || v.Reason == "" {
		t.Fatalf("nil policy verdict %+v", v)
	}
	if err := p.Validate(); err == nil {
		t.Fatal("nil policy validates")
	}
	if (&Policy{}).Decide(idAdmin, Request{Argv: argv("ls")}).Allowed {
		t.Fatal("zero policy allows")
	}
	if p.Explain() == "" {
		t.Fatal("nil policy has no explanation")
	}
}

func TestReasonQuotesHostileInput(t *testing.T) {
	p := mustParse(t, "decide.toml", decideTOML)
	name := "X\n\x1b[31mEVIL" + strings.Repeat("A", 1000)
	v := p.Decide(idAdmin, Request{Argv: argv("ls"), Env: []string{name + "=1"}})
	if v.Allowed || strings.ContainsAny(v.Reason, "\n\x1b") || len(v.Reason) > 300 {
		t.Fatalf("reason not sanitised: %q", v.Reason)
	}
}

func TestQuote(t *testing.T) {
	if got := quote("abc"); got != `"abc"` {
		t.Fatalf("quote = %s", got)
	}
	long := strings.Repeat("é", 100) // 200 bytes
	got := quote(long)
	if !strings.HasSuffix(got, "...(200 bytes)") || strings.Contains(got, `\x`) {
		t.Fatalf("quote cut a rune or lost the length: %s", got)
	}
}

// sshTOML has profiles for SSH keys: one only for keys, one for keys and a
// local group, one local only, and a catch-all that also accepts keys.
const sshTOML = `
version = 1

[[profile]]
name = "agent"
match = { ssh = true }
allow_shell = true
env = ["GREETING"]
sessions = { allowed = true, idle_timeout = "5m", max_lifetime = "2h" }
  [[profile.deny]]
  name = "no-curl"
  args_regex = 'curl'

[[profile]]
name = "narrow"
match = { ssh = true, groups = ["ops"] }
allow_shell = false

[[profile]]
name = "one-shot"
match = { ssh = true }
allow_shell = true

[[profile]]
name = "local"
match = { uids = [1000] }
allow_shell = true

[[profile]]
name = "everyone"
match = { any = true }
allow_shell = true
sessions = { allowed = true }
`

func sshID(profile string) Identity {
	return Identity{SSH: &SSHKey{Profile: profile, Fingerprint: "SHA256:abc", Comment: "alice@laptop", User: "agent", RemoteAddr: "127.0.0.1:5555"}}
}

func TestDecideSSH(t *testing.T) {
	p := mustParse(t, "ssh.toml", sshTOML)
	shell := func(s string) Request { return Request{Argv: argv("sh", "-c", s), Shell: true} }
	login := Request{Argv: argv("bash", "-l"), Interactive: true}
	tests := []struct {
		name    string
		id      Identity
		req     Request
		allowed bool
		profile string
		reason  string
	}{
		{"key names its profile", sshID("agent"), shell("uname -a"), true, "agent", "no allow rules"},
		{"key profile with env", sshID("agent"), Request{Argv: argv("sh", "-c", "env"), Shell: true, Env: []string{"GREETING=hi"}}, true, "agent", ""},
		{"key profile env refused", sshID("agent"), Request{Argv: argv("sh", "-c", "env"), Shell: true, Env: []string{"LANG=C"}}, false, "agent", `environment variable "LANG" is not allowed`},
		{"key profile deny rule", sshID("agent"), shell("curl x"), false, "agent", "deny rule"},
		{"key profile without shell", sshID("narrow"), shell("ls"), false, "narrow", "shell strings"},
		{"catch-all accepts keys", sshID("everyone"), shell("ls"), true, "everyone", ""},
		{"local-only profile refuses keys", sshID("local"), shell("ls"), false, "", `profile "local" does not accept SSH keys`},
		{"unknown profile", sshID("nosuch"), shell("ls"), false, "", `profile "nosuch" is not in the policy`},
		{"key is not uid 0", Identity{UID: 0, SSH: &SSHKey{Profile: "local"}}, shell("ls"), false, "", "does not accept SSH keys"},
		{"local keys of an ssh profile still match", Identity{UID: 1001, Groups: []string{"ops"}}, shell("ls"), false, "narrow", "shell strings"},
		{"ssh-only profile skipped for local callers", Identity{UID: 1000}, shell("ls"), true, "local", ""},
		{"local caller falls through to catch-all", Identity{UID: 4242, User: "mallory"}, shell("ls"), true, "everyone", ""},
		{"catch-all takes no uid without an account", Identity{UID: 100004, GID: 1000, Group: "alice", Groups: []string{"ops"}}, shell("ls"), false, "narrow", "shell strings"},
		{"catch-all takes no uid without an account, whatever its groups", Identity{UID: 100004, GID: 1000, Group: "alice"}, shell("ls"), false, "",
			"no policy profile matches uid 100004 (user name unknown): match.any takes only callers whose uid has an account"},
		{"a subordinate uid is its login", Identity{UID: 1000, User: "alice", SubUID: 100004}, shell("ls"), true, "local", ""},
		{"a subordinate uid's login takes the catch-all", Identity{UID: 1001, User: "bob", SubUID: 165540}, shell("ls"), true, "everyone", ""},

		{"interactive", sshID("agent"), login, true, "agent", ""},
		{"interactive needs sessions", sshID("one-shot"), login, false, "one-shot", "interactive shells are not allowed"},
		{"interactive needs shell", sshID("narrow"), login, false, "narrow", "interactive shells are not allowed"},
		{"interactive takes no timeout", sshID("agent"), Request{Argv: argv("bash", "-l"), Interactive: true, Timeout: time.Second}, false, "agent", "takes no timeout"},
		{"interactive is not a shell string", sshID("agent"), Request{Argv: argv("sh", "-c", "x"), Shell: true, Interactive: true}, false, "agent", "malformed interactive"},
		{"interactive in a named session", sshID("agent"), Request{Argv: argv("bash", "-l"), Session: "s", Interactive: true}, true, "agent", ""},
		{"interactive passes deny rules", sshID("agent"), Request{Argv: argv("curl"), Interactive: true}, false, "agent", "deny rule"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := p.Decide(tt.id, tt.req)
			if v.Allowed != tt.allowed || v.Profile != tt.profile || !strings.Contains(v.Reason, tt.reason) {
				t.Fatalf("Decide = {Allowed:%v Profile:%q Reason:%q}\nwant     {Allowed:%v Profile:%q Reason:~%q}",
					v.Allowed, v.Profile, v.Reason, tt.allowed, tt.profile, tt.reason)
			}
			checkVerdict(t, p, tt.req, v)
		})
	}
	ex := p.Explain()
	for _, want := range []string{
		"matches:  SSH keys that name the profile in the authorized-keys file\n",
		"matches:  members of group ops; or SSH keys that name the profile",
		"ssh:      commands (run as sh -c STRING) and interactive shells\n",
		"ssh:      nothing: SSH commands are shell strings and need allow_shell = true",
		"ssh:      commands (run as sh -c STRING); no interactive shells",
		"! SSH keys that name this profile get it",
		"including root (uid 0), and SSH keys that name it",
	} {
		if !strings.Contains(ex, want) {
			t.Errorf("Explain lacks %q:\n%s", want, ex)
		}
	}
	v := p.Decide(sshID("agent"), login)
	if v.Limits.Timeout != 2*time.Hour || v.Limits.SessionIdle != 5*time.Minute {
		t.Fatalf("interactive limits %+v: want the session's lifetime and idle timeout", v.Limits)
	}
}

func TestPolicyKeyHelpers(t *testing.T) {
	p := mustParse(t, "ssh.toml", sshTOML)
	for name, want := range map[string]string{"agent": "", "narrow": "", "everyone": "", "local": "does not accept SSH keys", "x": "not in the policy"} {
		err := p.CheckKeyProfile(name)
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want)) {
			t.Errorf("CheckKeyProfile(%q) = %v, want %q", name, err, want)
		}
	}
	for _, c := range []struct {
		id   Identity
		name string
		want bool
	}{
		{sshID("agent"), "GREETING", true},
		{sshID("agent"), "LANG", false},
		{sshID("agent"), "", false},
		{sshID("local"), "GREETING", false},
		{sshID("nosuch"), "GREETING", false},
		{Identity{UID: 1000, User: "alice"}, "GREETING", false},
	} {
		if got := p.AllowsEnv(c.id, c.name); got != c.want {
			t.Errorf("AllowsEnv(%s, %q) = %v, want %v", c.id.describe(), c.name, got, c.want)
		}
	}
	var nilp *Policy
	if nilp.AllowsEnv(sshID("agent"), "GREETING") || nilp.CheckKeyProfile("agent") == nil {
		t.Fatal("nil policy grants")
	}
}

// TestCallerLimits: a caller gets half the profile's VMs by default,
// what the policy says otherwise, and never more than max_vms; defaults
// apply to profiles that do not say.
func TestCallerLimits(t *testing.T) {
	tests := []struct {
		name      string
		settings  string
		vms, wait int
	}{
		{"built-in", "", 1, 4},
		{"half of max_vms", "max_vms = 5\n", 3, 4},
		{"explicit", "max_vms = 4\nmax_vms_per_caller = 4\nmax_queued_per_caller = 0\n", 4, 0},
		{"capped by max_vms", "max_vms = 3\nmax_vms_per_caller = 8\n", 3, 4},
		{"from defaults", "max_vms = 8\n[defaults]\nmax_vms_per_caller = 2\nmax_queued_per_caller = 1\n", 2, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, "x.toml", minimal+tt.settings)
			v := p.Decide(Identity{UID: 1000, User: "alice"}, Request{Argv: []string{"true"}})
			if !v.Allowed {
				t.Fatalf("refused: %s", v.Reason)
			}
			if v.Limits.CallerVMs != tt.vms || v.Limits.CallerQueue != tt.wait {
				t.Errorf("caller limits %d VMs, %d waiting; want %d, %d", v.Limits.CallerVMs, v.Limits.CallerQueue, tt.vms, tt.wait)
			}
		})
	}
}

func TestDecideTransfers(t *testing.T) {
	p := mustParse(t, "files.toml", `
version = 1

[[profile]]
name = "files"
match = { users = ["alice"] }
sessions = { allowed = true }
files = { put_max_bytes = "1KiB", put_max_files = 3 }
  [[profile.allow]]
  name = "only-ls"
  program = ["ls"]

[[profile]]
name = "sealed"
match = { users = ["bob"] }
sessions = { allowed = true }
files = { put_max_files = 0, get_max_files = 0 }
`)
	alice, bob := Identity{UID: 1, User: "alice"}, Identity{UID: 2, User: "bob"}
	for _, tc := range []struct {
		name string
		id   Identity
		req  Request
		ok   bool
		want string
	}{
		{"put with a command", alice, Request{Argv: argv("ls"), Puts: []Upload{{Files: 3, Bytes: 1024}}}, true, ""},
		{"too many files", alice, Request{Argv: argv("ls"), Puts: []Upload{{Files: 4}}}, false, "files.put_max_files = 3"},
		{"too many bytes", alice, Request{Argv: argv("ls"), Puts: []Upload{{Files: 1, Bytes: 1025}}}, false, "files.put_max_bytes"},
		{"transfer only in a session", alice, Request{Session: "s", Gets: 1}, true, "file transfer in session s"},
		{"transfer only skips argv rules", alice, Request{Session: "s", Puts: []Upload{{Files: 1}}}, true, ""},
		{"transfer only needs a session", alice, Request{Gets: 1}, false, "copies files in a session"},
		{"no argv, no transfer", alice, Request{Session: "s"}, false, "empty argv"},
		{"the command's rules still apply", alice, Request{Argv: argv("rm"), Gets: 1}, false, "no allow rule"},
		{"puts refused", bob, Request{Argv: argv("ls"), Puts: []Upload{{Files: 1}}}, false, "put_max_files = 0"},
		{"gets refused", bob, Request{Session: "s", Gets: 1}, false, "get_max_files = 0"},
	} {
		v := p.Decide(tc.id, tc.req)
		if v.Allowed != tc.ok || !strings.Contains(v.Reason, tc.want) {
			t.Errorf("%s: %+v; want allowed=%v and a reason with %q", tc.name, v, tc.ok, tc.want)
		}
	}
	v := p.Decide(alice, Request{Session: "s", Gets: 1})
	if v.Rule != "files" || v.Limits.Files != (FileLimits{PutBytes: 1024, PutFiles: 3, GetBytes: 64 << 20, GetFiles: 10000}) {
		t.Errorf("transfer verdict %+v", v)
	}
}

// TestMayRotateAudit: moving the audit log aside is its own right,
// audit_rotate; admin = true (status of everyone) does not grant it, and
// an SSH key never has it (issue 30, finding 5).
func TestMayRotateAudit(t *testing.T) {
	p := mustParse(t, "rotate.toml", `
version = 1

[[profile]]
name = "auditors"
match = { groups = ["audit"], ssh = true }
audit_rotate = true

[[profile]]
name = "admins"
match = { groups = ["wheel"] }
admin = true

[[profile]]
name = "everyone"
match = { any = true }
`)
	for _, c := range []struct {
		name string
		id   Identity
		want bool
	}{
		{"audit_rotate profile", Identity{UID: 1002, Groups: []string{"audit"}}, true},
		{"admin profile", Identity{UID: 1000, Groups: []string{"wheel"}}, false},
		{"plain profile", Identity{UID: 1001}, false},
		{"uid 0 is the daemon's to admit, not the policy's", Identity{UID: 0}, false},
		{"SSH key of the audit_rotate profile", Identity{SSH: &SSHKey{Profile: "auditors"}}, false},
	} {
		if got := p.MayRotateAudit(c.id); got != c.want {
			t.Errorf("%s: MayRotateAudit = %v, want %v", c.name, got, c.want)
		}
	}
	if !p.IsAdmin(Identity{UID: 1000, Groups: []string{"wheel"}}) || p.IsAdmin(Identity{UID: 1002, Groups: []string{"audit"}}) {
		t.Error("admin and audit_rotate are not independent")
	}
	if !strings.Contains(p.Explain(), "  audit:    its local callers may rotate the audit log (audit_rotate = true)\n") {
		t.Errorf("Explain does not show audit_rotate:\n%s", p.Explain())
	}
	var nilp *Policy
	if nilp.MayRotateAudit(Identity{UID: 1002, Groups: []string{"audit"}}) {
		t.Error("nil policy grants audit_rotate")
	}
	if Default().MayRotateAudit(Identity{UID: 1000}) {
		t.Error("the default policy grants audit_rotate")
	}
}

func TestDecideSession(t *testing.T) {
	p := mustParse(t, "decide.toml", decideTOML)
	for _, c := range []struct {
		id    Identity
		names []string
		ok    bool
	}{
		{idAdmin, nil, true},
		{idAdmin, []string{"a", "b.c"}, true},
		{idAdmin, []string{"a", "../x"}, false},
	} {
		v := p.DecideSession(c.id, "", c.names...)
		if v.Allowed != c.ok || v.Profile == "" {
			t.Errorf("DecideSession(%+v, %q) = %+v, want allowed %v", c.id, c.names, v, c.ok)
		}
		if v.Allowed && v.Limits.SessionMax == 0 {
			t.Errorf("an allowed session verdict without limits: %+v", v)
		}
	}
	if v := (*Policy)(nil).DecideSession(idAdmin, ""); v.Allowed {
		t.Error("a nil policy allowed a session")
	}
	noSessions := mustParse(t, "n.toml", "version = 1\n[[profile]]\nname = \"n\"\nmatch = { any = true }\nsessions.allowed = false\n")
	if v := noSessions.DecideSession(idAdmin, ""); v.Allowed || !strings.Contains(v.Reason, "not allowed") {
		t.Errorf("a profile without sessions: %+v", v)
	}
}

// TestGrantOf: what a caller may learn of its profile: its name, its
// images (the profile's first, no pins), shell strings, sessions, and its
// network with its rules; nothing for a caller
// no profile takes.
func TestGrantOf(t *testing.T) {
	p := mustParse(t, "g.toml", `version = 1
[[profile]]
name = "web"
match = { uids = [1000] }
allow_shell = true
sessions = { allowed = true }
[profile.network]
mode = "allowlist"
allow = ["example.com:443", "*.debian.org:80"]
[[profile]]
name = "plain"
match = { uids = [1001] }
[[profile]]
name = "images"
match = { uids = [1003] }
image = "py"
images = ["node", "py@sha256:`+strings.Repeat("0f", 32)+`", "default"]
`)
	for _, c := range []struct {
		uid  uint32
		want Grant
		ok   bool
	}{
		{1000, Grant{Profile: "web", Image: "default", Images: []string{"default"}, Shell: true, Sessions: true, Network: true, Allow: []string{"example.com:443", "*.debian.org:80"}}, true},
		{1001, Grant{Profile: "plain", Image: "default", Images: []string{"default"}}, true},
		{1003, Grant{Profile: "images", Image: "py", Images: []string{"py", "node", "default"}}, true},
		{1002, Grant{}, false},
	} {
		g, ok := p.GrantOf(Identity{UID: c.uid, GID: c.uid, User: "u"})
		if ok != c.ok || !reflect.DeepEqual(g, c.want) {
			t.Errorf("uid %d: %+v %v, want %+v %v", c.uid, g, ok, c.want, c.ok)
		}
	}
	if _, ok := (*Policy)(nil).GrantOf(Identity{UID: 1}); ok {
		t.Error("a nil policy granted something")
	}
}

// TestDecideUsers: a caller may name one of the profile's users; another
// is refused naming the key, and the default is the profile's user.
func TestDecideUsers(t *testing.T) {
	p := mustParse(t, "users.toml", `version = 1
[[profile]]
name = "p"
match = { uids = [1000] }
user = "agent"
users = ["agent", "root", "www-data"]
sessions = { allowed = true }
[[profile]]
name = "q"
match = { uids = [1001] }
`)
	id, other := Identity{UID: 1000, User: "u"}, Identity{UID: 1001, User: "o"}
	for _, tc := range []struct {
		id         Identity
		user, want string
		rule       string
	}{
		{id, "", "agent", ""},
		{id, "root", "root", ""},
		{id, "www-data", "www-data", ""},
		{id, "postgres", "", RuleUsers},
		{other, "", "agent", ""},
		{other, "agent", "agent", ""},
		{other, "root", "", RuleUsers},
	} {
		v := p.Decide(tc.id, Request{Argv: []string{"id"}, User: tc.user})
		switch {
		case tc.rule != "" && (v.Allowed || v.Rule != tc.rule || !strings.Contains(v.Reason, "is not one of the profile's users")):
			t.Errorf("%s as %q: %+v, want refused by %s", tc.id.User, tc.user, v, tc.rule)
		case tc.rule == "" && (!v.Allowed || v.User != tc.want):
			t.Errorf("%s as %q: %+v, want user %q", tc.id.User, tc.user, v, tc.want)
		}
	}
}

// TestDecideDetach: a background process runs in a session, without a
// terminal or transfers, and its time limit is timeout.max unless it asks
// for less.
func TestDecideDetach(t *testing.T) {
	p := mustParse(t, "detach.toml", `version = 1
[[profile]]
name = "p"
match = { uids = [1000] }
sessions = { allowed = true }
timeout = { default = "30s", max = "20m" }
`)
	id := Identity{UID: 1000, User: "u"}
	for _, tc := range []struct {
		name string
		req  Request
		want time.Duration // 0: refused
	}{
		{"in a session", Request{Argv: []string{"sleep", "9"}, Session: "s", Detach: true}, 20 * time.Minute},
		{"with a timeout", Request{Argv: []string{"sleep", "9"}, Session: "s", Detach: true, Timeout: time.Minute}, time.Minute},
		{"past timeout.max", Request{Argv: []string{"sleep", "9"}, Session: "s", Detach: true, Timeout: time.Hour}, 0},
		{"without a session", Request{Argv: []string{"sleep", "9"}, Detach: true}, 0},
		{"with a put", Request{Argv: []string{"sleep", "9"}, Session: "s", Detach: true, Puts: []Upload{{Files: 1, Bytes: 1}}}, 0},
		{"a command", Request{Argv: []string{"sleep", "9"}, Session: "s"}, 30 * time.Second},
	} {
		v := p.Decide(id, tc.req)
		if got := map[bool]time.Duration{true: v.Limits.Timeout, false: 0}[v.Allowed]; got != tc.want {
			t.Errorf("%s: %+v, want timeout %v", tc.name, v, tc.want)
		}
	}
}

// TestDecideFile: a file operation needs sessions and a user of the
// profile's; it runs as that user.
func TestDecideFile(t *testing.T) {
	p := mustParse(t, "files.toml", `version = 1
[[profile]]
name = "p"
match = { uids = [1000] }
users = ["agent", "root"]
sessions = { allowed = true }
[[profile]]
name = "q"
match = { uids = [1001] }
`)
	if v := p.DecideFile(Identity{UID: 1000, User: "u"}, FileRequest{}); !v.Allowed || v.User != "agent" || v.Limits.Files.GetBytes == 0 {
		t.Errorf("the default user: %+v", v)
	}
	if v := p.DecideFile(Identity{UID: 1000, User: "u"}, FileRequest{User: "root"}); !v.Allowed || v.User != "root" {
		t.Errorf("root: %+v", v)
	}
	if v := p.DecideFile(Identity{UID: 1000, User: "u"}, FileRequest{User: "www-data"}); v.Allowed || v.Rule != RuleUsers {
		t.Errorf("another user: %+v", v)
	}
	if v := p.DecideFile(Identity{UID: 1001, User: "o"}, FileRequest{}); v.Allowed || !strings.Contains(v.Reason, "sessions are not allowed") {
		t.Errorf("without sessions: %+v", v)
	}
}

// TestDecideImages: a caller may name one of the profile's images for a
// fresh VM or a session; another is refused naming the key, the default
// is the profile's image, and a session's operations are decided in the
// session's image, so that a reload that takes it away refuses them.
func TestDecideImages(t *testing.T) {
	pin := "sha256:" + strings.Repeat("0f", 32)
	p := mustParse(t, "images.toml", `version = 1
[[profile]]
name = "p"
match = { uids = [1000] }
image = "py"
images = ["default", "py@`+pin+`", "node"]
sessions = { allowed = true }
[[profile]]
name = "q"
match = { uids = [1001] }
sessions = { allowed = true }
`)
	id, other := Identity{UID: 1000, User: "u"}, Identity{UID: 1001, User: "o"}
	for _, tc := range []struct {
		id                Identity
		image, want, rule string
		session           string
		digest            string // the image's manifest digest now
		refused           bool
		reasonHas         string
	}{
		{id: id, image: "", digest: pin, want: "py"},
		{id: id, image: "py", digest: pin, want: "py"},
		// py imported again while the daemon runs: its pin refuses it.
		{id: id, image: "py", digest: "sha256:" + strings.Repeat("1e", 32), refused: true, rule: RuleImages,
			reasonHas: `image "py": pinned to ` + pin + `, but the image's manifest digest is sha256:1e1e`},
		{id: id, image: "", refused: true, rule: RuleImages, reasonHas: "the image has no manifest digest"},
		{id: id, image: "node", digest: pin, want: "node"}, // not pinned: any digest
		{id: id, image: "default", want: "default"},
		{id: id, image: "node", want: "node"},
		{id: id, image: "node", session: "s", want: "node"},
		{id: id, image: "ruby", refused: true, rule: RuleImages, reasonHas: `image "ruby" is not one of the profile's images (default, py, node)`},
		{id: id, image: "py@" + pin, refused: true, reasonHas: "must be 1 to 64"},
		{id: id, image: "../x", refused: true, reasonHas: "must be 1 to 64"},
		{id: other, image: "", want: "default"},
		{id: other, image: "default", want: "default"},
		{id: other, image: "py", refused: true, rule: RuleImages, reasonHas: "(default)"},
	} {
		v := p.Decide(tc.id, Request{Argv: []string{"id"}, Image: tc.image, Session: tc.session, ImageManifestDigest: tc.digest})
		name := fmt.Sprintf("%s in %q", tc.id.User, tc.image)
		switch {
		case tc.refused && (v.Allowed || v.Rule != tc.rule || !strings.Contains(v.Reason, tc.reasonHas)):
			t.Errorf("%s: %+v, want refused by %q with %q", name, v, tc.rule, tc.reasonHas)
		case !tc.refused && (!v.Allowed || v.Image != tc.want):
			t.Errorf("%s: %+v, want image %q", name, v, tc.want)
		}
		if tc.session == "" {
			continue
		}
		// The session's other requests are decided in its image.
		for what, v := range map[string]Verdict{
			"session": p.DecideSession(tc.id, tc.image, "fork-1"),
			"file":    p.DecideFile(tc.id, FileRequest{Image: tc.image}),
			"netlock": p.DecideNetLock(tc.id, tc.image, nil, NetLimit{}),
		} {
			if !v.Allowed || v.Image != tc.want {
				t.Errorf("%s: %s: %+v, want image %q", name, what, v, tc.want)
			}
		}
	}
	// A reload that takes the session's image away refuses its requests.
	reloaded := mustParse(t, "reloaded.toml", `version = 1
[[profile]]
name = "p"
match = { uids = [1000] }
image = "py"
sessions = { allowed = true }
`)
	for what, v := range map[string]Verdict{
		"exec":    reloaded.Decide(id, Request{Argv: []string{"id"}, Image: "node", Session: "s"}),
		"session": reloaded.DecideSession(id, "node"),
		"file":    reloaded.DecideFile(id, FileRequest{Image: "node"}),
		"netlock": reloaded.DecideNetLock(id, "node", nil, NetLimit{}),
		"publish": reloaded.DecidePublish(id, PublishRequest{Session: "s", GuestPort: 80, Host: HostAddr{Unix: "/run/x"}, Image: "node"}),
	} {
		if v.Allowed || v.Rule != RuleImages || !strings.Contains(v.Reason, `image "node" is not one of the profile's images (py)`) {
			t.Errorf("after the reload, %s: %+v, want refused by %s", what, v, RuleImages)
		}
	}
	if v := reloaded.DecideSession(id, ""); !v.Allowed || v.Image != "py" {
		t.Errorf("the profile's image: %+v", v)
	}

	if got, want := p.Images(), []ProfileImage{{"p", "py", pin}, {"p", "default", ""}, {"p", "node", ""}, {"q", "default", ""}}; !reflect.DeepEqual(got, want) {
		t.Errorf("Images() = %+v, want %+v", got, want)
	}
	if want := `image "py" (a caller may name py@` + pin + `, default, node)`; !strings.Contains(p.Explain(), want) {
		t.Errorf("Explain does not say %s:\n%s", want, p.Explain())
	}
	var shapes []string
	for _, s := range p.Shapes() {
		shapes = append(shapes, s.Image)
	}
	if want := []string{"py", "default", "node"}; !reflect.DeepEqual(shapes, want) {
		t.Errorf("the shapes' images: %q, want %q (one per image, the profile's first, q's the same as p's default)", shapes, want)
	}
}

// TestCheckPin: an image matches its pin by its manifest digest; one
// without a digest never matches one.
func TestCheckPin(t *testing.T) {
	a, b := "sha256:"+strings.Repeat("a", 64), "sha256:"+strings.Repeat("b", 64)
	for _, tc := range []struct {
		pin, digest, errHas string
	}{
		{"", "", ""},
		{"", a, ""},
		{a, a, ""},
		{a, b, "the image's manifest digest is " + b},
		{a, "", "the image has no manifest digest"},
	} {
		err := CheckPin(tc.pin, tc.digest)
		if (err == nil) != (tc.errHas == "") || err != nil && !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("CheckPin(%q, %q) = %v, want %q", tc.pin, tc.digest, err, tc.errHas)
		}
	}
}

// TestDecideImageUser: the image's configured user is the default of a
// request that names none, when it is one of the profile's users; the
// profile's user otherwise, and a user the caller names always.
func TestDecideImageUser(t *testing.T) {
	p := mustParse(t, "imageuser.toml", `version = 1
[[profile]]
name = "p"
match = { uids = [1000] }
users = ["agent", "node"]
sessions = { allowed = true }
`)
	id := Identity{UID: 1000, User: "u"}
	for _, tc := range []struct{ imageUser, user, want string }{
		{"", "", "agent"},
		{"node", "", "node"},
		{"postgres", "", "agent"},
		{"node", "agent", "agent"},
		{"", "node", "node"},
	} {
		v := p.Decide(id, Request{Argv: []string{"id"}, User: tc.user, ImageUser: tc.imageUser})
		if !v.Allowed || v.User != tc.want {
			t.Errorf("image user %q, user %q: %+v, want %q", tc.imageUser, tc.user, v, tc.want)
		}
		f := p.DecideFile(id, FileRequest{User: tc.user, ImageUser: tc.imageUser})
		if !f.Allowed || f.User != tc.want {
			t.Errorf("file: image user %q, user %q: %+v, want %q", tc.imageUser, tc.user, f, tc.want)
		}
	}
	if v := p.Decide(id, Request{Argv: []string{"id"}, User: "postgres", ImageUser: "postgres"}); v.Allowed || v.Rule != RuleUsers {
		t.Errorf("the image's user named by the caller, not one of users: %+v", v)
	}
}
