package mcpserver

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/names"

	"github.com/vmgate/vmgate/gateway/client/shelltool"
)

var sessionArgCases = []struct {
	in      string
	start   string // parseStart's result
	startE  string // or its error
	end     string // parseEnd's result
	endE    string // or its error
	execE   string // parseSessionExec's error ("" = ok)
	comment string
}{
	{`{}`, "", "", "", `"session" is missing`, `"session" is missing`, "empty object"},
	{``, "", "", "", `"session" is missing`, `"session" is missing`, "no arguments at all"},
	{`null`, "", "", "", `"session" is missing`, `"session" is missing`, "null arguments"},
	{`{"name":null,"session":null}`, "", "", "", `"session" is missing`, `"session" is missing`, "null fields"},
	{`{"name":"work"}`, "work", "", "", `"session" is missing`, `"session" is missing`, ""},
	{`{"name":"a/b"}`, "", "not a session name", "", `"session" is missing`, `"session" is missing`, "slash"},
	{`{"name":".."}`, "", "not a session name", "", `"session" is missing`, `"session" is missing`, "dot-dot"},
	{`{"name":""}`, "", "not a session name", "", `"session" is missing`, `"session" is missing`, "empty name"},
	{`{"name":7}`, "", "must be a string", "", `"session" is missing`, `"session" is missing`, "number"},
	{`{"session":"s1","command":"ls"}`, "", "", "s1", "", "", ""},
	{`{"session":"s1"}`, "", "", "s1", "", `"command" is missing`, "no command"},
	{`{"session":"` + strings.Repeat("x", 65) + `","command":"ls"}`, "", "", "", "not a session name", "not a session name", "too long"},
	{`{"session":["s1"],"command":"ls"}`, "", "", "", "must be a string", "must be a string", ""},
	{`{"session":"s1","command":"ls","timeout":"x"}`, "", "", "s1", "", "not an integer", ""},
	{`[1]`, "", "not a JSON object", "", "not a JSON object", "not a JSON object", ""},
	{`{"session":"s1"`, "", "not a JSON object", "", "not a JSON object", "not a JSON object", ""},
	{`{"name":"work","image":"py"}`, "work", "", "", `"session" is missing`, `"session" is missing`, "an image"},
}

func checkErr(t *testing.T, what, in string, err error, want string) bool {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Errorf("%s(%s): %v", what, in, err)
		}
		return err == nil
	}
	if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, shelltool.ErrArgs) {
		t.Errorf("%s(%s): err = %v, want %q wrapping ErrArgs", what, in, err, want)
	}
	return false
}

// TestParseImage: exec_shell_command's and session_start's "image" is
// optional, and a name an image can have when present.
func TestParseImage(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{`{}`, "", ""},
		{``, "", ""},
		{`{"command":"ls","image":null}`, "", ""},
		{`{"command":"ls","image":"py"}`, "py", ""},
		{`{"name":"s","image":"debian-12.5_slim"}`, "debian-12.5_slim", ""},
		{`{"image":""}`, "", "is not an image name"},
		{`{"image":"../x"}`, "", "is not an image name"},
		{`{"image":"py@sha256:00"}`, "", "is not an image name"},
		{`{"image":7}`, "", "must be a string"},
		{`[1]`, "", "not a JSON object"},
		{`{"secrets":"GH"}`, "", "must be an array of names"},
		{`{"secrets":["GH-1"]}`, "", "is not a secret's name"},
		{`{"secrets":null}`, "", ""},
	} {
		got, err := parseVMChoice([]byte(tc.in))
		if checkErr(t, "parseVMChoice", tc.in, err, tc.err) && got.image != tc.want {
			t.Errorf("parseVMChoice(%s) = %q, want %q", tc.in, got.image, tc.want)
		}
	}
	c, err := parseVMChoice([]byte(`{"command":"ls","secrets":["GH_TOKEN","NPM_TOKEN"]}`))
	if err != nil || !slices.Equal(c.secrets, []string{"GH_TOKEN", "NPM_TOKEN"}) {
		t.Errorf("secrets = %q, %v", c.secrets, err)
	}
}

func TestSessionArgs(t *testing.T) {
	for _, tc := range sessionArgCases {
		got, err := parseStart([]byte(tc.in))
		if checkErr(t, "parseStart", tc.in, err, tc.startE) && got != tc.start {
			t.Errorf("parseStart(%s) = %q, want %q", tc.in, got, tc.start)
		}
		got, err = parseEnd([]byte(tc.in))
		if checkErr(t, "parseEnd", tc.in, err, tc.endE) && got != tc.end {
			t.Errorf("parseEnd(%s) = %q, want %q", tc.in, got, tc.end)
		}
		name, a, err := parseSessionExec([]byte(tc.in))
		if checkErr(t, "parseSessionExec", tc.in, err, tc.execE) {
			if name != tc.end || a.Command != "ls" || a.Timeout != shelltool.DefaultTimeout || a.MaxOutputSize != shelltool.DefaultMaxOutputSize {
				t.Errorf("parseSessionExec(%s) = %q, %+v", tc.in, name, a)
			}
		}
	}
	// The exec arguments are exactly shelltool's.
	name, a, err := parseSessionExec([]byte(`{"session":"s","command":"x","timeout":"5","max_output_size":99}`))
	if err != nil || name != "s" || a != (shelltool.Args{Command: "x", Timeout: 5 * time.Second, MaxOutputSize: 99}) {
		t.Fatalf("%q %+v %v", name, a, err)
	}
}

func TestNewSessionName(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		n := newSessionName()
		if !names.Session(n) || !strings.HasPrefix(n, sessionNamePrefix) || seen[n] {
			t.Fatalf("bad or repeated name %q", n)
		}
		seen[n] = true
	}
}

func TestSessionExecSchema(t *testing.T) {
	s := sessionExecSchema()
	props := s["properties"].(map[string]any)
	for _, k := range []string{"session", "command", "timeout", "max_output_size"} {
		if props[k] == nil {
			t.Errorf("no property %s", k)
		}
	}
	if req := s["required"].([]string); len(req) != 2 || req[0] != "session" || req[1] != "command" {
		t.Errorf("required = %v", req)
	}
	// shelltool.Schema is not modified.
	if _, ok := shelltool.Schema()["properties"].(map[string]any)["session"]; ok {
		t.Error("sessionExecSchema changed shelltool.Schema")
	}
}

// FuzzSessionArgs: the session tools' parsers never panic, every error
// wraps ErrArgs, and every name they accept is a valid session name.
func FuzzSessionArgs(f *testing.F) {
	for _, tc := range sessionArgCases {
		f.Add([]byte(tc.in))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(what, name string, err error, required bool) {
			if err != nil {
				if !errors.Is(err, shelltool.ErrArgs) {
					t.Fatalf("%s: error %v does not wrap ErrArgs", what, err)
				}
				return
			}
			if (name != "" || required) && !names.Session(name) {
				t.Fatalf("%s accepted %q", what, name)
			}
		}
		n, err := parseStart(b)
		check("parseStart", n, err, false)
		n, err = parseEnd(b)
		check("parseEnd", n, err, true)
		if c, err := parseVMChoice(b); err == nil && (c.image != "" && !names.Image(c.image) || slices.ContainsFunc(c.secrets, func(n string) bool { return !names.EnvVar(n) })) {
			t.Fatalf("parseVMChoice accepted %+v", c)
		} else if err != nil && !errors.Is(err, shelltool.ErrArgs) {
			t.Fatalf("parseVMChoice: error %v does not wrap ErrArgs", err)
		}
		n, _, err = parseSessionExec(b)
		check("parseSessionExec", n, err, true)
	})
}

func TestParseFork(t *testing.T) {
	for raw, ok := range map[string]bool{
		`{"session":"s"}`:                         true,
		`{"session":"s","names":["a","b"]}`:       true,
		`{"session":"s","count":3}`:               true,
		`{"session":"../s"}`:                      false,
		`{"session":"s","names":["a","../b"]}`:    false,
		`{"session":"s","names":["a"],"count":2}`: false,
		`{"session":"s","count":65}`:              false,
		`{"session":"s","extra":1}`:               false,
		`[]`:                                      false,
	} {
		if _, err := parseFork(json.RawMessage(raw)); (err == nil) != ok {
			t.Errorf("parseFork(%s): %v, want ok %v", raw, err, ok)
		}
	}
}

func TestParseNetLock(t *testing.T) {
	for raw, want := range map[string]string{
		`{"session":"s"}`:                             "",
		`{"session":"s","allow":[]}`:                  "",
		`{"session":"s","allow":["a.test:80"]}`:       "",
		`{"allow":["a.test:80"]}`:                     "not a session name",
		`{"session":"s","allow":"a.test:80"}`:         "invalid arguments",
		`{"session":"s","deny":[]}`:                   "invalid arguments",
		`{"session":"s","allow":[` + manyRules + `]}`: "at most 64 rules",
	} {
		_, err := parseNetLock(json.RawMessage(raw))
		if (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", raw, err, want)
		}
	}
}

var manyRules = strings.TrimSuffix(strings.Repeat(`"a.test:80",`, maxLockRules+1), ",")
