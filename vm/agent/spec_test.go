package agent

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/vm/agentproto"
)

// decodeOpen is what the agent does with an open's payload: package
// agentconn decodes it strictly, the session validates it.
func decodeOpen(data []byte) (agentproto.Open, error) {
	var o agentproto.Open
	if err := agentproto.DecodeStrict(data, &o); err != nil {
		return agentproto.Open{}, err
	}
	if err := validateOpen(o); err != nil {
		return agentproto.Open{}, err
	}
	return o, nil
}

func TestDecodeOpen(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want *agentproto.ExecSpec // nil: must be rejected
	}{
		{`{"spec":{"argv":["echo","hi"]}}`, &agentproto.ExecSpec{Argv: []string{"echo", "hi"}}},
		{` {"spec":{"argv":["a"],"env":["K=V","E="],"dir":"/tmp","user":"agent"}} `,
			&agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"K=V", "E="}, Dir: "/tmp", User: "agent"}},
		{`{"spec":{"argv":["a"],"user":"root"}}`, &agentproto.ExecSpec{Argv: []string{"a"}, User: "root"}},
		{`{"spec":{"argv":["a",""]}}`, &agentproto.ExecSpec{Argv: []string{"a", ""}}},
		{`{"spec":{"argv":["a"],"env":["K=V=W"]}}`, &agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"K=V=W"}}},
		{`{"spec":{"argv":["a"]},"pty":{"term":"xterm","columns":80,"rows":24}}`, &agentproto.ExecSpec{Argv: []string{"a"}}},
		{`null`, nil},
		{``, nil},
		{`[]`, nil},
		{`{"spec":{"argv":null}}`, nil},
		{`{"spec":{"argv":"echo"}}`, nil},
		{`{"spec":{"argv":["a"],"user":"Root"}}`, nil},
		{`{"spec":{"argv":["a"],"env":["K"]}}`, nil},
		{`{"spec":{"argv":["a"],"env":["\u0000=1"]}}`, nil},
		{`{"spec":{"argv":["a"],"env":["K=\u0000"]}}`, nil},
		{`{"spec":{"argv":["a"],"extra":1}}`, nil},
		{`{"spec":{"argv":["a"]},"extra":1}`, nil},
		{`{"spec":{"argv":["a"]}}{"spec":{"argv":["b"]}}`, nil},
		{`{"spec":{"argv":["a\u0000"]}}`, nil},
		{`{"spec":{"argv":["a"]},"pty":{"term":"x\u0000","columns":80,"rows":24}}`, nil},
		{`{"spec":{"argv":["a"]},"pty":{"term":"xterm","columns":80,"rows":5000}}`, nil},
	} {
		got, err := decodeOpen([]byte(tc.doc))
		switch {
		case tc.want == nil && err == nil:
			t.Errorf("%s: accepted as %+v", tc.doc, got)
		case tc.want != nil && err != nil:
			t.Errorf("%s: %v", tc.doc, err)
		case tc.want != nil && !specEqual(got.Spec, *tc.want):
			t.Errorf("%s: got %+v, want %+v", tc.doc, got.Spec, *tc.want)
		}
	}
}

func specEqual(a, b agentproto.ExecSpec) bool {
	return slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && a.Dir == b.Dir && a.User == b.User
}

func FuzzDecodeOpen(f *testing.F) {
	for _, seed := range []string{
		`{"spec":{"argv":["echo","hi"]}}`,
		`{"spec":{"argv":["sh","-c","exit 3"],"env":["A=1","B="],"dir":"/tmp","user":"agent"}}`,
		`{"spec":{"argv":["x"],"user":"root"},"pty":{"term":"vt100","columns":1,"rows":1}}`,
		`{"spec":{"argv":[]}}`,
		`{"spec":{"argv":[""]}}`,
		`{"spec":{"argv":["a\u0000b"]}}`,
		`{"spec":{"argv":["a"],"env":["=x"]}}`,
		`{"spec":{"argv":["a"],"unknown":true}}`,
		`{"spec":{"argv":["a"]}} {}`,
		`null`,
		`{"spec":{"argv":["\ud800"],"dir":"\u0000"}}`,
		"{\"spec\":{\"argv\":[\"\xff\"]}}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := decodeOpen(data)
		if err != nil {
			return
		}
		spec := o.Spec
		if len(spec.Argv) == 0 || spec.Argv[0] == "" {
			t.Fatalf("accepted spec without a program: %+v", spec)
		}
		all := append(slices.Clone(spec.Argv), spec.Env...)
		all = append(all, spec.Dir, spec.User)
		if o.PTY != nil {
			all = append(all, o.PTY.Term)
		}
		for _, s := range all {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("accepted an open with a NUL byte: %q", s)
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
		// An accepted open survives a round trip through the host's encoding.
		b, err := json.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeOpen(b)
		if err != nil || !specEqual(again.Spec, spec) || (again.PTY == nil) != (o.PTY == nil) {
			t.Fatalf("round trip of %+v: %+v, %v", o, again, err)
		}
	})
}
