package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// decodeOpen is what the agent does with an open's payload: package
// agentconn decodes it, the session validates it.
func decodeOpen(data []byte) (agentproto.Open, error) {
	var o agentproto.Open
	if err := o.UnmarshalBinary(data); err != nil {
		return agentproto.Open{}, err
	}
	if err := validateOpen(o); err != nil {
		return agentproto.Open{}, err
	}
	return o, nil
}

func TestDecodeOpen(t *testing.T) {
	spec := func(argv ...string) agentproto.ExecSpec { return agentproto.ExecSpec{Argv: argv} }
	xterm := &agentproto.PTY{Term: "xterm", Columns: 80, Rows: 24}
	for _, tc := range []struct {
		o  agentproto.Open
		ok bool
	}{
		{agentproto.Open{Spec: spec("echo", "hi")}, true},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"K=V", "E="}, Dir: "/tmp", User: "agent"}}, true},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, User: "root"}}, true},
		{agentproto.Open{Spec: spec("a", "")}, true},
		{agentproto.Open{Spec: spec("a", "\xff\xfe not UTF-8")}, true},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"K=V=W"}}}, true},
		{agentproto.Open{Spec: spec("a"), PTY: xterm}, true},
		{agentproto.Open{}, false},
		{agentproto.Open{Spec: spec("")}, false},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, User: "Root"}}, true},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, User: "builder"}}, true},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, User: "a:b"}}, false},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, User: "a\nb"}}, false},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, User: "a\x00"}}, false},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"K"}}}, false},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"\x00=1"}}}, false},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"K=\x00"}}}, false},
		{agentproto.Open{Spec: spec("a\x00")}, false},
		{agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"a"}, Dir: "/\x00"}}, false},
		{agentproto.Open{Spec: spec("a"), PTY: &agentproto.PTY{Term: "x\x00", Columns: 80, Rows: 24}}, false},
		{agentproto.Open{Spec: spec("a"), PTY: &agentproto.PTY{Term: "xterm", Columns: 80, Rows: 5000}}, false},
	} {
		b, _ := tc.o.MarshalBinary()
		got, err := decodeOpen(b)
		switch {
		case !tc.ok && err == nil:
			t.Errorf("%+v: accepted as %+v", tc.o, got)
		case tc.ok && err != nil:
			t.Errorf("%+v: %v", tc.o, err)
		case tc.ok && (!specEqual(got.Spec, tc.o.Spec) || (got.PTY == nil) != (tc.o.PTY == nil)):
			t.Errorf("%+v: decoded as %+v", tc.o, got)
		}
	}
	good, _ := agentproto.Open{Spec: spec("echo", "hi")}.MarshalBinary()
	for name, b := range map[string][]byte{
		"empty":          nil,
		"cut short":      good[:len(good)-1],
		"trailing bytes": append(append([]byte(nil), good...), 0),
		"a flag of 2":    append(append([]byte(nil), good[:len(good)-1]...), 2),
		"a huge count":   {0xff, 0xff, 0xff, 0xff},
	} {
		if o, err := decodeOpen(b); err == nil {
			t.Errorf("%s: accepted as %+v", name, o)
		}
	}
}

func specEqual(a, b agentproto.ExecSpec) bool {
	return slices.Equal(a.Argv, b.Argv) && slices.Equal(a.Env, b.Env) && a.Dir == b.Dir && a.User == b.User
}

func FuzzDecodeOpen(f *testing.F) {
	for _, o := range []agentproto.Open{
		{Spec: agentproto.ExecSpec{Argv: []string{"echo", "hi"}}},
		{Spec: agentproto.ExecSpec{Argv: []string{"sh", "-c", "exit 3"}, Env: []string{"A=1", "B="}, Dir: "/tmp", User: "agent"}},
		{Spec: agentproto.ExecSpec{Argv: []string{"x"}, User: "root"}, PTY: &agentproto.PTY{Term: "vt100", Columns: 1, Rows: 1}},
		{Spec: agentproto.ExecSpec{Argv: []string{""}}},
		{Spec: agentproto.ExecSpec{Argv: []string{"a\x00b"}}},
		{Spec: agentproto.ExecSpec{Argv: []string{"a"}, Env: []string{"=x"}}},
		{Spec: agentproto.ExecSpec{Argv: []string{"\xff"}}},
	} {
		b, _ := o.MarshalBinary()
		f.Add(b)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
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
		if !validUserName(spec.User) {
			t.Fatalf("accepted user %q", spec.User)
		}
		// An accepted open re-encodes to the same bytes: one encoding per
		// value, so the host's and the agent's views cannot differ.
		b, _ := o.MarshalBinary()
		if string(b) != string(data) {
			t.Fatalf("%+v re-encodes differently", o)
		}
	})
}
