package policy

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated part of docs/policy.md")

// refKeyAt returns the key that the schema reaches at dotted path p.
func refKeyAt(t *testing.T, keys []*refKey, p string) *refKey {
	t.Helper()
	for _, k := range keys {
		if slices.Contains(k.paths, p) {
			return k
		}
	}
	t.Fatalf("no key at %s", p)
	return nil
}

func TestReferenceKeys(t *testing.T) {
	keys := referenceKeys()
	tests := []struct {
		path   string // any path the key has
		shown  string // the path Reference shows
		typ    string
		tables []string
		def    string // in refDefaults
	}{
		{"version", "version", "integer", []string{""}, refRequired},
		{"profile", "profile", "array of tables", []string{""}, refRequired},
		{"profile.name", "profile.name", "string", []string{"[[profile]]"}, refRequired},
		{"profile.match", "profile.match", "table", []string{"[[profile]]"}, refRequired},
		{"profile.match.uids", "profile.match.uids", "array of integers", []string{"[profile.match]"}, ""},
		{"profile.match.ssh", "profile.match.ssh", "boolean", []string{"[profile.match]"}, ""},
		{"defaults.memory_mib", "profile.memory_mib", "integer", []string{"[[profile]]", "[defaults]"}, "512"},
		{"profile.output_limit", "profile.output_limit", "size", []string{"[[profile]]", "[defaults]"}, `"1MiB"`},
		{"profile.env", "profile.env", "array of strings", []string{"[[profile]]", "[defaults]"}, "[]"},
		{"defaults.timeout.default", "profile.timeout.default", "duration", []string{"[profile.timeout]", "[defaults.timeout]"}, `"30s"`},
		{"profile.sessions.max_lifetime", "profile.sessions.max_lifetime", "duration", []string{"[profile.sessions]", "[defaults.sessions]"}, `"1h"`},
		{"profile.network", "profile.network", "table", []string{"[[profile]]", "[defaults]"}, ""},
		{"profile.network.mode", "profile.network.mode", "string", []string{"[profile.network]", "[defaults.network]"}, `"none"`},
		{"profile.network.max_bytes", "profile.network.max_bytes", "size", []string{"[profile.network]", "[defaults.network]"}, `"256MiB"`},
		{"profile.network.allow_ranges", "profile.network.allow_ranges", "array of strings", []string{"[profile.network]", "[defaults.network]"}, "[]"},
		{"profile.allow", "profile.allow", "array of tables", []string{"[[profile]]"}, ""},
		{"profile.allow.name", "profile.deny.name", "string", []string{"[[profile.deny]]", "[[profile.allow]]"}, ""},
		{"profile.allow.program", "profile.deny.program", "array of strings", []string{"[[profile.deny]]", "[[profile.allow]]"}, ""},
		{"profile.allow.args", "profile.deny.args", "array of strings", []string{"[[profile.deny]]", "[[profile.allow]]"}, ""},
		{"profile.allow.args_any", "profile.deny.args_any", "array of strings", []string{"[[profile.deny]]", "[[profile.allow]]"}, ""},
		{"profile.allow.args_regex", "profile.deny.args_regex", "string", []string{"[[profile.deny]]", "[[profile.allow]]"}, ""},
		{"isolate", "isolate", "table", []string{""}, ""},
		{"isolate.seccomp", "isolate.seccomp", "string", []string{"[isolate]"}, `"required"`},
		{"isolate.cgroups", "isolate.cgroups", "string", []string{"[isolate]"}, `"auto"`},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			k := refKeyAt(t, keys, tt.path)
			if k.path != tt.shown || k.typ != tt.typ || !slices.Equal(k.tables, tt.tables) {
				t.Errorf("got %s (%s) in %q, want %s (%s) in %q", k.path, k.typ, k.tables, tt.shown, tt.typ, tt.tables)
			}
			if d := refDefaults[k.path]; d != tt.def {
				t.Errorf("default %q, want %q", d, tt.def)
			}
		})
	}
}

// TestReferenceRendered checks a few rows and headings of the Markdown.
func TestReferenceRendered(t *testing.T) {
	ref := Reference()
	for _, want := range []string{
		"\n## Top level\n",
		"\n## `[[profile]]` and `[defaults]`\n",
		"\n## `[[profile.deny]]` and `[[profile.allow]]`\n",
		"\n## `[isolate]`\n",
		"| `profile.network.mode` | string | `[profile.network]`, `[defaults.network]` | `\"none\"` | ",
		"| `profile.memory_mib` | integer | `[[profile]]`, `[defaults]` | `512` | Guest memory in MiB, 64 to 1048576. |",
		"| `profile.timeout.max` | duration | `[profile.timeout]`, `[defaults.timeout]` | `\"10m\"` | ",
		"| `profile.deny.program` | array of strings | `[[profile.deny]]`, `[[profile.allow]]` | — | ",
		"| `isolate.seccomp` | string | `[isolate]` | `\"required\"` | ",
		"| `version` | integer | top level | *required* | ",
		"The `timeout`, `sessions`, `network` and `files` tables merge key",
	} {
		if !strings.Contains(ref, want) {
			t.Errorf("reference lacks %q", want)
		}
	}
	if ref != Reference() {
		t.Error("Reference is not deterministic")
	}
}

// TestReferenceCoversSchema checks that the reference walks exactly the
// keys that decoding accepts.
func TestReferenceCoversSchema(t *testing.T) {
	var want []string
	var flatten func(n schemaNode, prefix string)
	flatten = func(n schemaNode, prefix string) {
		for k, child := range n {
			p := strings.TrimPrefix(prefix+"."+k, ".")
			want = append(want, p)
			flatten(child, p)
		}
	}
	flatten(schemaKeys, "")
	var got []string
	for _, k := range referenceKeys() {
		got = append(got, k.paths...)
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("reference paths:\n%q\nschema paths:\n%q", got, want)
	}
}

// TestReferenceDescriptions makes every key of the schema documented, and
// every description a key of the schema: a new key fails here until it is
// described, a removed or renamed one until its description goes.
func TestReferenceDescriptions(t *testing.T) {
	keys := referenceKeys()
	shown := map[string]*refKey{}
	for _, k := range keys {
		shown[k.path] = k
		d := refDescriptions[k.path]
		switch {
		case d == "":
			t.Errorf("%s: no description in refDescriptions", k.path)
		case strings.Contains(d, "\n"), !strings.HasSuffix(d, "."):
			t.Errorf("%s: description must be one line ending in a period: %q", k.path, d)
		}
		if _, ok := refDefaults[k.path]; !ok && !k.isTable {
			t.Errorf("%s: no entry in refDefaults (\"\" if it has no default)", k.path)
		}
	}
	for name, m := range map[string][]string{
		"refDescriptions": slices.Collect(maps.Keys(refDescriptions)),
		"refDefaults":     slices.Collect(maps.Keys(refDefaults)),
		"refDurations":    slices.Collect(maps.Keys(refDurations)),
	} {
		for _, p := range m {
			if _, ok := shown[p]; ok {
				continue
			}
			msg := "no such key in the schema"
			for _, k := range keys {
				if slices.Contains(k.paths, p) {
					msg = "use " + k.path + ", the path Reference shows"
				}
			}
			t.Errorf("%s[%q]: %s", name, p, msg)
		}
	}
}

// refPolicy is a valid policy with top-level lines top and lines in its
// profile prof; with allowlist, the profile has an allowlisted network.
func refPolicy(top, prof string, allowlist bool) string {
	s := "version = 1\n" + top + "[[profile]]\nname = \"p\"\nmatch = { any = true }\n"
	if allowlist {
		s += "network.mode = \"allowlist\"\nnetwork.allow = [\"example.com:443\"]\n"
	}
	return s + prof
}

// TestReferenceDefaults sets every key with a built-in default to that
// value, in [defaults] and in the profile, and checks that the compiled
// policy is the one without it: the documented default is the code's.
func TestReferenceDefaults(t *testing.T) {
	compiled := func(t *testing.T, src string) []any {
		t.Helper()
		p, err := Parse("ref.toml", []byte(src))
		if err != nil {
			t.Fatalf("%v\n%s", err, src)
		}
		return []any{p.profiles, p.seccomp, p.cgroups}
	}
	for _, k := range referenceKeys() {
		def := refDefaults[k.path]
		if def == "" || def == refRequired {
			continue
		}
		t.Run(k.path, func(t *testing.T) {
			allowlist := strings.HasPrefix(k.path, "profile.network.") && k.path != "profile.network.mode"
			want := compiled(t, refPolicy("", "", allowlist))
			for _, p := range k.paths {
				var src string
				switch {
				case strings.HasPrefix(p, "profile."):
					src = refPolicy("", strings.TrimPrefix(p, "profile.")+" = "+def+"\n", allowlist)
				default:
					src = refPolicy(p+" = "+def+"\n", "", allowlist)
				}
				if got := compiled(t, src); !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %s changes the compiled policy: it is not the built-in default", p, def)
				}
			}
		})
	}
}

// TestReferenceDurations checks refDurations against validation: a string
// key is parsed as a duration if and only if the reference says so.
func TestReferenceDurations(t *testing.T) {
	for _, k := range referenceKeys() {
		if k.typ != "string" && k.typ != "duration" {
			continue
		}
		i := slices.IndexFunc(k.paths, func(p string) bool { return strings.HasPrefix(p, defaultsTable+".") })
		if i < 0 {
			continue // not a setting: no duration
		}
		src := refPolicy(k.paths[i]+" = \"1 fortnight\"\n", "", false)
		_, err := Parse("ref.toml", []byte(src))
		isDuration := err != nil && strings.Contains(err.Error(), "invalid duration")
		if isDuration != (k.typ == "duration") {
			t.Errorf("%s: documented as %s, but validation of \"1 fortnight\" says: %v", k.path, k.typ, err)
		}
	}
}

// The generated part of docs/policy.md lies between these lines.
const (
	refBegin = "<!-- BEGIN GENERATED REFERENCE: go test ./policy -run TestPolicyReferenceDoc -update -->"
	refEnd   = "<!-- END GENERATED REFERENCE -->"
)

// TestPolicyReferenceDoc keeps docs/policy.md equal to Reference. Run
// `go test ./policy -run TestPolicyReferenceDoc -update` to rewrite it.
func TestPolicyReferenceDoc(t *testing.T) {
	path := filepath.Join("..", "docs", "policy.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	i, j := strings.Index(text, refBegin), strings.Index(text, refEnd)
	if i < 0 || j < i {
		t.Fatalf("%s: want the generated part between the lines\n%s\n%s", path, refBegin, refEnd)
	}
	want := text[:i+len(refBegin)] + "\n\n" + Reference() + "\n" + text[j:]
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if text != want {
		got, exp := strings.Split(text, "\n"), strings.Split(want, "\n")
		n := 0
		for n < min(len(got), len(exp)) && got[n] == exp[n] {
			n++
		}
		line := func(l []string) string {
			if n < len(l) {
				return l[n]
			}
			return "(end of file)"
		}
		t.Errorf("%s is out of date; review and run `go test ./policy -run TestPolicyReferenceDoc -update`.\nline %d:\n have: %s\n want: %s",
			path, n+1, line(got), line(exp))
	}
}

// TestPolicyDocExamples parses every TOML example in docs/policy.md.
func TestPolicyDocExamples(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "docs", "policy.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := strings.Split(string(data), "```toml\n")[1:]
	if len(blocks) == 0 {
		t.Fatal("docs/policy.md: no ```toml example")
	}
	for i, b := range blocks {
		src, _, ok := strings.Cut(b, "```")
		if !ok {
			t.Fatalf("example %d: unterminated", i)
		}
		if _, err := Parse(fmt.Sprintf("docs/policy.md example %d", i), []byte(src)); err != nil {
			t.Errorf("%v\n%s", err, src)
		}
	}
}
