package agent

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/vm/agentproto"
)

func TestDecodeExecSpec(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want *agentproto.ExecSpec // nil: must be rejected
	}{
		{`{"argv":["echo","hi"]}`, &agentproto.ExecSpec{Argv: []string{"echo", "hi"}}},
		{` {"argv":["a"],"env":["K=V","E="],"dir":"/tmp","user":"agent"} `,
			&agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"K=V", "E="}, Dir: "/tmp", User: "agent"}},
		{`{"argv":["a"],"user":"root"}`, &agentproto.ExecSpec{Argv: []string{"a"}, User: "root"}},
		{`{"argv":["a",""]}`, &agentproto.ExecSpec{Argv: []string{"a", ""}}},
		{`{"argv":["a"],"env":["K=V=W"]}`, &agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"K=V=W"}}},
		{`null`, nil},
		{``, nil},
		{`[]`, nil},
		{`{"argv":null}`, nil},
		{`{"argv":"echo"}`, nil},
		{`{"argv":["a"],"user":"Root"}`, nil},
		{`{"argv":["a"],"env":["K"]}`, nil},
		{`{"argv":["a"],"env":["\u0000=1"]}`, nil},
		{`{"argv":["a"],"env":["K=\u0000"]}`, nil},
		{`{"argv":["a"],"extra":1}`, nil},
		{`{"argv":["a"]}{"argv":["b"]}`, nil},
		{`{"argv":["a\u0000"]}`, nil},
	} {
		got, err := decodeExecSpec([]byte(tc.doc))
		switch {
		case tc.want == nil && err == nil:
			t.Errorf("%s: accepted as %+v", tc.doc, got)
		case tc.want != nil && err != nil:
			t.Errorf("%s: %v", tc.doc, err)
		case tc.want != nil && !specEqual(got, *tc.want):
			t.Errorf("%s: got %+v, want %+v", tc.doc, got, *tc.want)
		}
	}
}

func TestDecodeExecSpecTooLarge(t *testing.T) {
	doc := `{"argv":["` + strings.Repeat("a", maxSpecBytes) + `"]}`
	if _, err := decodeExecSpec([]byte(doc)); err == nil {
		t.Fatal("oversized spec accepted")
	}
}

func specEqual(a, b agentproto.ExecSpec) bool {
	return slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && a.Dir == b.Dir && a.User == b.User
}

func FuzzDecodeExecSpec(f *testing.F) {
	for _, seed := range []string{
		`{"argv":["echo","hi"]}`,
		`{"argv":["sh","-c","exit 3"],"env":["A=1","B="],"dir":"/tmp","user":"agent"}`,
		`{"argv":["x"],"user":"root"}`,
		`{"argv":[]}`,
		`{"argv":[""]}`,
		`{"argv":["a\u0000b"]}`,
		`{"argv":["a"],"env":["=x"]}`,
		`{"argv":["a"],"unknown":true}`,
		`{"argv":["a"]} {}`,
		`null`,
		`{"argv":["\ud800"],"dir":"\u0000"}`,
		"{\"argv\":[\"\xff\"]}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		spec, err := decodeExecSpec(data)
		if err != nil {
			if !specEqual(spec, agentproto.ExecSpec{}) {
				t.Fatalf("rejected spec returned with content: %+v", spec)
			}
			return
		}
		if len(spec.Argv) == 0 || spec.Argv[0] == "" {
			t.Fatalf("accepted spec without a program: %+v", spec)
		}
		all := append(slices.Clone(spec.Argv), spec.Env...)
		all = append(all, spec.Dir, spec.User)
		for _, s := range all {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("accepted spec with a NUL byte: %q", s)
			}
		}
		for _, kv := range spec.Env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
				t.Fatalf("accepted env entry %q", kv)
			}
		}
		if !allowedUser(spec.User) {
			t.Fatalf("accepted user %q", spec.User)
		}
		// An accepted spec survives a round trip through the host's encoding.
		b, err := json.Marshal(spec)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeExecSpec(b)
		if err != nil || !specEqual(again, spec) {
			t.Fatalf("round trip of %+v: %+v, %v", spec, again, err)
		}
	})
}
