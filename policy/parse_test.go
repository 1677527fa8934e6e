package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp/syntax"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// minimal is a valid policy that test cases extend.
const minimal = "version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = true }\n"

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // substrings of the error, all required
	}{
		{"unknown key with line", minimal + "bogus = 1\n", []string{"x.toml:5: unknown key profile.bogus"}},
		{"unknown top-level key", "version = 1\nfoo = 2\n" + minimal[12:], []string{"x.toml:2: unknown key foo"}},
		{"unknown key in inline table", minimal + "timeout = { max = \"1m\", defualt = \"1s\" }\n", []string{"x.toml:5: unknown key profile.timeout.defualt", "did you mean profile.timeout.default?"}},
		{"unknown key in rule", minimal + "[[profile.allow]]\nprogram = [\"ls\"]\nargz = []\n", []string{"x.toml:7: unknown key profile.allow.argz", "did you mean profile.allow.args?"}},
		{"unknown table reported once", minimal + "[profile.limits]\nmemory = 1\ncpus = 2\n", []string{"x.toml:5: unknown key profile.limits"}},
		{"case differs", minimal + "CPUs = 2\n", []string{"x.toml:5: unknown key profile.CPUs", "did you mean profile.cpus?"}},
		{"top-level table after profile", minimal + "[timeout]\nmax = \"1m\"\n", []string{"x.toml:5: unknown key timeout", "did you mean [profile.timeout]?"}},
		{"unknown key in two profiles", minimal + "colour = 1\n[[profile]]\nname = \"q\"\nmatch = { uids = [1] }\ncolour = 2\n", []string{"x.toml:5: unknown key profile.colour\n", "x.toml:9: unknown key profile.colour"}},
		{"case differs with sibling", minimal + "Name = \"q\"\n", []string{"x.toml:5: unknown key profile.Name (did you mean profile.name?)"}},
		{"type error in earlier profile", "version = 1\n[[profile]]\nname = \"a\"\nmatch = { uids = [1] }\ncpus = \"two\"\n[[profile]]\nname = \"b\"\nmatch = { uids = [2] }\ncpus = 2\n", []string{"x.toml:5: profile.cpus: incompatible types"}},
		{"type error in earlier rule", "version = 1\n[[profile]]\nname = \"a\"\nmatch = { uids = [1] }\n[[profile.deny]]\nname = 1\n[[profile]]\nname = \"b\"\nmatch = { uids = [2] }\n", []string{"x.toml:6: profile.deny.name: incompatible types"}},
		{"size type error in earlier profile", "version = 1\n[[profile]]\nname = \"a\"\nmatch = { uids = [1] }\noutput_limit = 1.5\n[[profile]]\nname = \"b\"\nmatch = { uids = [2] }\noutput_limit = 2\n", []string{"x.toml:5:", "output_limit: expected an integer"}},
		{"several unknown keys", minimal + "a1 = 1\n[defaults]\nb2 = 2\n", []string{"x.toml:5: unknown key profile.a1", "x.toml:7: unknown key defaults.b2"}},
		{"type error with line", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = true }\ncpus = \"two\"\n", []string{"x.toml:5: profile.cpus: incompatible types"}},
		{"type error in list", minimal + "env = [\"A\", 1]\n", []string{"x.toml:5:", "profile.env"}},
		{"type error of version", "version = \"1\"\n", []string{"x.toml:1: version: incompatible types"}},
		{"output_limit type", minimal + "output_limit = true\n", []string{"x.toml:5:", "output_limit", "expected an integer number of bytes"}},
		{"syntax error", "version = 1\n[[profile]]\nname = \"p\nmatch = 1\n", []string{"x.toml:3:", "3 | name = \"p"}},
		{"duplicate key", "version = 1\nversion = 1\n", []string{"x.toml:2:", "already been defined", "2 | version = 1"}},
		{"missing version", "[[profile]]\nname = \"p\"\nmatch = { any = true }\n", []string{"x.toml: version: missing"}},
		{"version 2", "version = 2\n" + minimal[12:], []string{"x.toml: version 2: not supported"}},
		{"no profiles", "version = 1\n", []string{"no [[profile]]"}},
		{"duplicate profile names", minimal + "[[profile]]\nname = \"p\"\nmatch = { uids = [1] }\n", []string{`profile[1]: name "p": already used by profile[0]`}},
		{"bad profile name", "version = 1\n[[profile]]\nname = \"Web_Fetch\"\nmatch = { uids = [1] }\n", []string{`profile[0]: name "Web_Fetch": must be`}},
		{"missing profile name", "version = 1\n[[profile]]\nmatch = { uids = [1] }\n", []string{"profile[0]: name: missing"}},
		{"missing match", "version = 1\n[[profile]]\nname = \"p\"\n", []string{`profile "p": match: missing`}},
		{"empty match", "version = 1\n[[profile]]\nname = \"p\"\nmatch = {}\n", []string{`profile "p": match: empty`}},
		{"any false", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = false }\n", []string{"match.any false"}},
		{"any with uids", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = true, uids = [0] }\n", []string{"any = true cannot be combined"}},
		{"bad uid", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { uids = [-1, 4294967295] }\n", []string{"match.uids: -1: not a valid id", "match.uids: 4294967295: not a valid id"}},
		{"empty groups", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { groups = [] }\n", []string{"match.groups: empty list"}},
		{"bad group name", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { groups = [\"a b\"] }\n", []string{`match.groups: "a b": not a valid`}},
		{"ssh false", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { ssh = false, uids = [1] }\n", []string{`profile "p": match.ssh false: remove it`}},
		{"ssh with any", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { ssh = true, any = true }\n", []string{`profile "p": match: any = true already accepts SSH keys`}},
		{"audit_rotate for everyone", minimal + "audit_rotate = true\n", []string{`profile "p": audit_rotate = true with match.any = true would let every caller rotate the audit log`}},
		{"audit_rotate type", minimal + "audit_rotate = 1\n", []string{"x.toml:5:", "profile.audit_rotate: incompatible types"}},
		{"ssh type", "version = 1\n[[profile]]\nname = \"p\"\nmatch = { ssh = \"yes\" }\n", []string{"x.toml:4:", "profile.match.ssh: incompatible types"}},
		{"local keys after any", minimal + "[[profile]]\nname = \"q\"\nmatch = { ssh = true, uids = [1] }\n", []string{`profile "q": match: uids, users, gids and groups are unreachable`}},
		{"unreachable profile", minimal + "[[profile]]\nname = \"q\"\nmatch = { uids = [1] }\n", []string{`profile "q": unreachable: profile "p" before it matches any caller`}},
		{"bad duration", minimal + "timeout = { max = \"5x\" }\n", []string{`profile "p": timeout.max "5x": invalid duration`}},
		{"bad duration in defaults", minimal + "[defaults]\ntimeout = { default = \"soon\" }\n", []string{`defaults: timeout.default "soon": invalid duration`}},
		{"integer duration", minimal + "timeout = { max = 5 }\n", []string{"x.toml:5: profile.timeout.max: incompatible types"}},
		{"negative duration", minimal + "timeout = { max = \"-5s\" }\n", []string{`timeout.max "-5s": must be positive`}},
		{"zero duration", minimal + "sessions = { idle_timeout = \"0s\" }\n", []string{`sessions.idle_timeout "0s": must be positive`}},
		{"default above max", minimal + "timeout = { default = \"1h\", max = \"10m\" }\n", []string{`profile "p": timeout.default 1h is above timeout.max 10m`}},
		{"default above inherited max", minimal + "timeout = { default = \"20m\" }\n", []string{`profile "p": timeout.default 20m is above timeout.max 10m`}},
		{"defaults default above max", minimal + "[defaults]\ntimeout = { max = \"1s\" }\n", []string{"defaults: timeout.default 30s is above timeout.max 1s"}},
		{"idle above lifetime", minimal + "sessions = { allowed = true, idle_timeout = \"2h\" }\n", []string{"sessions.idle_timeout 2h is above sessions.max_lifetime 1h"}},
		{"negative memory", minimal + "memory_mib = -1\n", []string{`profile "p": memory_mib -1: must be between 64 and 1048576`}},
		{"zero cpus", minimal + "cpus = 0\n", []string{"cpus 0: must be between 1 and 64"}},
		{"disk_mib too small", minimal + "disk_mib = 10\n", []string{`profile "p": disk_mib 10: must be between 64 and 1048576`}},
		{"disk_mib too large", minimal + "[defaults]\ndisk_mib = 2000000\n", []string{`defaults: disk_mib 2000000: must be between 64 and 1048576`}},
		{"disk_mib as a size", minimal + "disk_mib = \"1GiB\"\n", []string{"x.toml:5: profile.disk_mib: incompatible types"}},
		{"disk_mib typo", minimal + "disk_mb = 100\n", []string{"disk_mb"}},
		{"negative max_vms", minimal + "max_vms = -3\n", []string{"max_vms -3: must be between 1 and 1024"}},
		{"zero max_vms_per_caller", minimal + "max_vms_per_caller = 0\n", []string{"max_vms_per_caller 0: must be between 1 and 1024"}},
		{"negative max_queued_per_caller", minimal + "max_queued_per_caller = -1\n", []string{"max_queued_per_caller -1: must be between 0 and 1024"}},
		{"negative output_limit", minimal + "output_limit = -1\n", []string{"output_limit -1: must be between 1 byte and 1GiB"}},
		{"output_limit too large", minimal + "output_limit = \"2GiB\"\n", []string{`output_limit "2GiB": must be between`}},
		{"output_limit overflow", minimal + "output_limit = \"99999999999999999999KiB\"\n", []string{"must be between"}},
		{"output_limit bad unit", minimal + "output_limit = \"1MB\"\n", []string{`output_limit "1MB": invalid size`}},
		{"network mode", minimal + "network = { mode = \"nat\" }\n", []string{`network.mode "nat": want "none" or "allowlist"`}},
		{"network allowlist without rules", minimal + "network = { mode = \"allowlist\" }\n", []string{`would allow nothing`}},
		{"network bad rule", minimal + "network = { mode = \"allowlist\", allow = [\"example.com\"] }\n", []string{`network.allow: network rule "example.com"`}},
		{"network bad range", minimal + "network = { mode = \"allowlist\", allow = [\"a.test:80\"], allow_ranges = [\"10.0.0.0/99\"] }\n", []string{`network.allow_ranges "10.0.0.0/99"`}},
		{"network rules without allowlist", minimal + "network = { allow = [\"a.test:80\"] }\n", []string{`need network.mode = "allowlist"`}},
		{"network max_connections", minimal + "network = { mode = \"allowlist\", allow = [\"a.test:80\"], max_connections = 0 }\n", []string{`network.max_connections`}},
		{"guest user", minimal + "user = \"Admin!\"\n", []string{`user "Admin!": must be a guest account's name`}},
		{"guest users", minimal + "users = [\"agent\", \"agent\", \"../x\"]\n", []string{`users: "agent" is listed twice`, `users: "../x": must be a guest account's name`}},
		{"default user not among users", minimal + "user = \"root\"\nusers = [\"agent\"]\n", []string{`user "root" is not one of users ["agent"]`}},
		{"images", minimal + "images = [\"default\", \"py\", \"py@sha256:abababababababababababababababababababababababababababababababab\", \"../x\", \"a@sha256:AB\", \"b@md5:00\"]\n",
			[]string{`images: "py" is listed twice`, `images: image name "../x": must be`, `images: pin "sha256:AB": must be sha256: followed by 64 lower-case hex digits`, `pin "md5:00"`}},
		{"images empty", minimal + "images = []\n", []string{`images is empty`}},
		{"default image not among images", minimal + "image = \"py\"\nimages = [\"default\"]\n", []string{`image "py" is not one of images ["default"]`}},
		{"images of [defaults] without the image", "version = 1\n[defaults]\nimages = [\"py\"]\n[[profile]]\nname = \"p\"\nmatch = { any = true }\n", []string{`profile "p": image "default" is not one of images ["py"]`}},
		{"image name", minimal + "image = \"../x\"\n", []string{`image "../x": must be`}},
		{"env name", minimal + "env = [\"A-B\", \"LANG\", \"LANG\"]\n", []string{`env: "A-B": not a variable name`, `env: "LANG" listed twice`}},
		{"bad regex", minimal + "[[profile.deny]]\nargs_regex = '('\n", []string{`profile "p": deny[0]: args_regex "(": error parsing regexp`}},
		{"empty regex", minimal + "[[profile.deny]]\nargs_regex = ''\n", []string{"args_regex: empty pattern"}},
		{"bad glob", minimal + "[[profile.allow]]\nargs = [\"[\"]\n", []string{`profile "p": allow[0]: args[0] "[": syntax error in pattern`}},
		{"bad glob in args_any", minimal + "[[profile.deny]]\nargs_any = [\"a\\\\\"]\n", []string{`deny[0]: args_any[0] "a\\": syntax error in pattern`}},
		{"inverted range", minimal + "[[profile.deny]]\nargs_any = [\"[z-a]\"]\n", []string{"range 'z'-'a' is empty"}},
		{"rest not last", minimal + "[[profile.allow]]\nargs = [\"...\", \"x\"]\n", []string{`args[0] "...": only allowed as the last element`}},
		{"empty rule", minimal + "[[profile.deny]]\nname = \"nothing\"\n", []string{`profile "p": deny[0]: no condition`}},
		{"empty program list", minimal + "[[profile.deny]]\nprogram = []\n", []string{"program: empty list"}},
		{"unclean program", minimal + "[[profile.deny]]\nprogram = [\"/usr/bin/../bin/rm\"]\n", []string{`program "/usr/bin/../bin/rm": path is not clean`}},
		{"relative program", minimal + "[[profile.deny]]\nprogram = [\"./rm\"]\n", []string{`program "./rm": relative path`}},
		{"duplicate rule names", minimal + "[[profile.deny]]\nname = \"r\"\nprogram = [\"a\"]\n[[profile.allow]]\nname = \"r\"\nprogram = [\"b\"]\n", []string{`allow[0]: name "r": already used by deny[0] r`}},
		{"bad rule name", minimal + "[[profile.deny]]\nname = \"No Good\"\nprogram = [\"a\"]\n", []string{`deny[0]: name "No Good": must be`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse("x.toml", []byte(tt.src))
			if err == nil {
				t.Fatalf("Parse succeeded:\n%s", p.Explain())
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestParseReportsAllProblems checks that validation goes on after the first
// problem and joins them all.
func TestParseReportsAllProblems(t *testing.T) {
	src := `version = 1
[[profile]]
name = "web-fetch"
match = { users = ["llama"] }
timeout = { max = "5x" }
memory_mib = 1
network = { mode = "allowlist" }
[[profile.allow]]
args = ["["]
[[profile]]
name = "web-fetch"
match = { any = true }
`
	_, err := Parse("p.toml", []byte(src))
	if err == nil {
		t.Fatal("Parse succeeded")
	}
	want := []string{
		`p.toml: profile "web-fetch": memory_mib 1: must be between`,
		`p.toml: profile "web-fetch": timeout.max "5x": invalid duration`,
		`p.toml: profile "web-fetch": network.mode "allowlist" without network.allow rules would allow nothing`,
		`p.toml: profile "web-fetch": allow[0]: args[0] "[": syntax error in pattern`,
		`p.toml: profile[1]: name "web-fetch": already used by profile[0]`,
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("problem %d = %q, want prefix %q", i, lines[i], w)
		}
	}
	if !errors.Is(err, path.ErrBadPattern) {
		t.Errorf("errors.Is(err, path.ErrBadPattern) = false")
	}
}

func TestParseErrorTypes(t *testing.T) {
	_, err := Parse("x.toml", []byte("version = 1\nversion = 2\n"))
	var perr toml.ParseError
	if !errors.As(err, &perr) || perr.Position.Line != 2 {
		t.Fatalf("syntax error does not wrap toml.ParseError at line 2: %v", err)
	}
	_, err = Parse("x.toml", []byte(minimal+"[[profile.deny]]\nargs_regex = '(?P<'\n"))
	var serr *syntax.Error
	if !errors.As(err, &serr) {
		t.Fatalf("regexp error not wrapped: %v", err)
	}
}

func TestParseSettings(t *testing.T) {
	src := `version = 1
[defaults]
memory_mib = 1024
timeout = { default = "1m", max = "20m" }
sessions = { allowed = true, max_lifetime = "3h" }
output_limit = 2048
env = ["A"]

[[profile]]
name = "inherits"
match = { uids = [1] }

[[profile]]
name = "overrides"
match = { gids = [2] }
memory_mib = 256
timeout = { max = "1h" }
sessions = { idle_timeout = "1m" }
output_limit = "512KiB"
env = []
`
	p := mustParse(t, "s.toml", src)
	inh, ovr := p.profiles[0], p.profiles[1]
	if inh.limits.MemoryMiB != 1024 || inh.limits.Timeout != time.Minute || inh.timeoutMax != 20*time.Minute ||
		!inh.limits.AllowSessions || inh.limits.SessionMax != 3*time.Hour || inh.limits.SessionIdle != builtinSessionIdle ||
		inh.limits.OutputLimit != 2048 || !inh.env.allows("A") || inh.limits.CPUs != builtinCPUs || inh.allowShell {
		t.Errorf("inherits: %+v", inh)
	}
	if ovr.limits.MemoryMiB != 256 || ovr.limits.Timeout != time.Minute || ovr.timeoutMax != time.Hour ||
		!ovr.limits.AllowSessions || ovr.limits.SessionIdle != time.Minute || ovr.limits.SessionMax != 3*time.Hour ||
		ovr.limits.OutputLimit != 512<<10 || ovr.env.allows("A") {
		t.Errorf("overrides: %+v", ovr)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"1": 1, "1B": 1, "512KiB": 512 << 10, "1MiB": 1 << 20, "1 MiB": 1 << 20, "1GiB": 1 << 30, "1073741824": 1 << 30,
	} {
		got, err := parseSize(sizeValue{s: in, isText: true})
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "0B", "1KB", "1mib", "-1", "1.5MiB", "2GiB", "1073741825", " 1", "1  MiB"} {
		if got, err := parseSize(sizeValue{s: in, isText: true}); err == nil {
			t.Errorf("parseSize(%q) = %d, want error", in, got)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	_, err := Load(filepath.Join(dir, "missing.toml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load(missing) = %v, want fs.ErrNotExist", err)
	}
	file := filepath.Join(dir, "vmgate.toml")
	if err := os.WriteFile(file, []byte(minimal+"bogus = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Load(file)
	if err == nil || !strings.HasPrefix(err.Error(), file+":5: unknown key profile.bogus") {
		t.Fatalf("Load = %v, want %s:5: unknown key", err, file)
	}
	if err := os.WriteFile(file, []byte(minimal), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := Load(file)
	if err != nil || p.Source() != file {
		t.Fatalf("Load = %v, %v", p, err)
	}
}

func TestSchemaMatchesDocument(t *testing.T) {
	// Every key example.toml uses is known, and a few keys that exist only
	// deeper in the tree are not known at the top.
	for _, k := range []toml.Key{{"version"}, {"defaults", "timeout", "max"}, {"profile", "deny", "args_any"}, {"profile", "memory_mib"}, {"profile", "match", "groups"}} {
		if !schemaKeys.has(k) {
			t.Errorf("schema lacks %s", k)
		}
	}
	for _, k := range []toml.Key{{"name"}, {"defaults", "name"}, {"defaults", "deny"}, {"profile", "cpus", "x"}, {"profile", "Name"}} {
		if schemaKeys.has(k) {
			t.Errorf("schema has %s", k)
		}
	}
}

func TestIsolateSeccomp(t *testing.T) {
	base := "version = 1\n[[profile]]\nname = \"a\"\nmatch = { any = true }\n"
	p, err := Parse("p.toml", []byte(base))
	if err != nil || p.Seccomp() != "required" {
		t.Fatalf("default: %v %v", p.Seccomp(), err)
	}
	p, err = Parse("p.toml", []byte(base+"[isolate]\nseccomp = \"off\"\n"))
	if err != nil || p.Seccomp() != "off" || !strings.Contains(p.Explain(), "RELAXATION") {
		t.Fatalf("off: %v %v", p, err)
	}
	if _, err := Parse("p.toml", []byte(base+"[isolate]\nseccomp = \"maybe\"\n")); err == nil || !strings.Contains(err.Error(), "isolate.seccomp") {
		t.Fatalf("bad value: %v", err)
	}
	if _, err := Parse("p.toml", []byte(base+"[isolate]\nbogus = 1\n")); err == nil {
		t.Fatal("unknown isolate key accepted")
	}
	if Default().Seccomp() != "required" {
		t.Fatal("embedded default must require seccomp")
	}
}

func TestIsolateCgroups(t *testing.T) {
	base := "version = 1\n[[profile]]\nname = \"a\"\nmatch = { any = true }\n"
	for _, c := range []struct{ doc, want, explain string }{
		{base, "auto", "when vmgated has a delegated cgroup"},
		{base + "[isolate]\ncgroups = \"required\"\n", "required", "does not start without one"},
		{base + "[isolate]\ncgroups = \"off\"\nseccomp = \"required\"\n", "off", "RELAXATION: isolate.cgroups"},
	} {
		p, err := Parse("p.toml", []byte(c.doc))
		if err != nil || p.Cgroups() != c.want || !strings.Contains(p.Explain(), c.explain) {
			t.Errorf("%q: got %q, %v", c.doc, p.Cgroups(), err)
		}
	}
	if _, err := Parse("p.toml", []byte(base+"[isolate]\ncgroups = true\n")); err == nil {
		t.Error("a boolean cgroups value was accepted")
	}
	if _, err := Parse("p.toml", []byte(base+"[isolate]\ncgroups = \"yes\"\n")); err == nil || !strings.Contains(err.Error(), "isolate.cgroups") {
		t.Errorf("bad value: %v", err)
	}
	if Default().Cgroups() != "auto" {
		t.Error("embedded default must be auto")
	}
}

func TestNetworkPolicy(t *testing.T) {
	src := `version = 1
[defaults]
network = { max_connections = 8 }
[[profile]]
name = "web-fetch"
match = { any = true }
[profile.network]
mode = "allowlist"
allow = ["*.wikipedia.org:443", "example.com:80"]
allow_ranges = ["10.20.0.0/16"]
max_bytes = "10MiB"
connect_rate = 30
`
	p, err := Parse("p.toml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	v := p.Decide(Identity{UID: 1000, User: "alice"}, Request{Argv: []string{"wget", "https://en.wikipedia.org/"}})
	n := v.Network
	if !v.Allowed || n == nil || len(n.Rules) != 2 || n.MaxConns != 8 || n.MaxBytes != 10<<20 || len(n.AllowedRanges) != 1 || n.ConnectRate != 30 {
		t.Fatalf("verdict %+v network %+v", v, n)
	}
	if _, ok := n.Rules.AllowsName("en.wikipedia.org", 443); !ok {
		t.Error("rule does not match")
	}
	ex := p.Explain()
	for _, want := range []string{"egress only to *.wikipedia.org:443, example.com:80", "RELAXATION: network.allow_ranges 10.20.0.0/16"} {
		if !strings.Contains(ex, want) {
			t.Errorf("explain lacks %q:\n%s", want, ex)
		}
	}
	if v := Default().Decide(Identity{UID: 1000, User: "alice"}, Request{Argv: []string{"true"}}); v.Network != nil {
		t.Error("the default policy gives VMs a network")
	}
}

// TestDigest: a policy's digest is the SHA-256 of the bytes it was parsed
// from, as sha256sum of the file prints it; a one-byte change changes it.
func TestDigest(t *testing.T) {
	p, err := Parse("x.toml", []byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(minimal))
	if got := p.Digest(); got != hex.EncodeToString(sum[:]) {
		t.Fatalf("digest %s, want %x", got, sum)
	}
	q, err := Parse("x.toml", []byte(minimal+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if q.Digest() == p.Digest() {
		t.Fatal("a changed file kept its digest")
	}
	if Default().Digest() == "" {
		t.Fatal("the built-in policy has no digest")
	}
}

func TestIsolateGuestASLR(t *testing.T) {
	base := "version = 1\n[[profile]]\nname = \"a\"\nmatch = { any = true }\n"
	for _, c := range []struct{ doc, want, explain string }{
		{base, "auto", "RELAXATION (under TCG with QEMU before 8.0 only)"},
		{base + "[isolate]\nguest_aslr = \"auto\"\n", "auto", "isolate.guest_aslr = \"auto\""},
		{base + "[isolate]\nguest_aslr = \"on\"\n", "on", "keep their address space randomisation"},
	} {
		p, err := Parse("p.toml", []byte(c.doc))
		if err != nil || p.GuestASLR() != c.want || !strings.Contains(p.Explain(), c.explain) {
			t.Errorf("%q: got %q, %v", c.doc, p.GuestASLR(), err)
		}
	}
	if _, err := Parse("p.toml", []byte(base+"[isolate]\nguest_aslr = \"off\"\n")); err == nil || !strings.Contains(err.Error(), "isolate.guest_aslr") {
		t.Errorf("bad value: %v", err)
	}
	if Default().GuestASLR() != "auto" {
		t.Error("embedded default must be auto")
	}
}
