package shelltool

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Args
		wantErr string
	}{
		{`{"command":"ls"}`, Args{"ls", DefaultTimeout, DefaultMaxOutputSize}, ""},
		{`{"command":"ls","timeout":30,"max_output_size":100}`, Args{"ls", 30 * time.Second, 100}, ""},
		{`{"command":"ls","timeout":"5","max_output_size":"200"}`, Args{"ls", 5 * time.Second, 200}, ""},
		{`{"command":"ls","timeout":5.0}`, Args{"ls", 5 * time.Second, DefaultMaxOutputSize}, ""},
		{`{"command":"ls","timeout":600,"max_output_size":1000000}`, Args{"ls", MaxTimeout, DefaultMaxOutputSize}, ""},
		{`{"command":"ls","timeout":0,"max_output_size":-1}`, Args{"ls", DefaultTimeout, DefaultMaxOutputSize}, ""},
		{`{"command":"ls","timeout":null}`, Args{"ls", DefaultTimeout, DefaultMaxOutputSize}, ""},
		{`{"command":"ls","timeout":99999999999999}`, Args{"ls", MaxTimeout, DefaultMaxOutputSize}, ""},
		{`{"command":"ls","extra":1}`, Args{"ls", DefaultTimeout, DefaultMaxOutputSize}, ""},
		{`{"command":"ls","timeout":2.5}`, Args{}, "not an integer"},
		{`{"command":"ls","timeout":"soon"}`, Args{}, "not an integer"},
		{`{"command":"ls","timeout":[1]}`, Args{}, "not an integer"},
		{`{"cmd":"ls"}`, Args{}, `"command" is missing`},
		{`{"command":["ls"]}`, Args{}, "must be a string"},
		{`{"command":"  "}`, Args{}, "is empty"},
		{`{"command":"a\u0000b"}`, Args{}, "NUL"},
		{`{"command":"ls"`, Args{}, "not a JSON object"},
		{`"ls"`, Args{}, "not a JSON object"},
		{``, Args{}, "not a JSON object"},
	} {
		got, err := ParseArgs([]byte(tc.in))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, ErrArgs) {
				t.Errorf("%s: err = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct {
		out       string
		truncated bool
		code      int
		timedOut  bool
		want      string
	}{
		{"", false, 0, false, "\n[exit code: 0]"},
		{"hi\n", false, 0, false, "hi\n\n[exit code: 0]"},
		{"abc", true, 2, false, "abc\n[output truncated]\n[exit code: 2]"},
		{"x", false, 1, true, "x\n[exit code: 1] [exit due to timed out]"},
		{"\xff", false, 0, false, "\uFFFD\n[exit code: 0]"},
	} {
		if got := Format([]byte(tc.out), tc.truncated, tc.code, tc.timedOut); got != tc.want {
			t.Errorf("Format(%q) = %q, want %q", tc.out, got, tc.want)
		}
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		r    wire.Result
		want int
	}{
		{wire.Result{ExitCode: 0}, 0},
		{wire.Result{ExitCode: 7}, 7},
		{wire.Result{ExitCode: -1, Signal: "KILL", TimedOut: true}, 1},
		{wire.Result{ExitCode: -1, Signal: "TERM"}, 143},
		{wire.Result{ExitCode: -1, Signal: "SEGV"}, 139},
		{wire.Result{ExitCode: -1, Signal: "WEIRD"}, 128},
		{wire.Result{ExitCode: -1, Signal: "XCPU"}, 152},
		{wire.Result{ExitCode: -1, Signal: "XFSZ"}, 153},
	} {
		if got := ExitCode(&tc.r); got != tc.want {
			t.Errorf("ExitCode(%+v) = %d, want %d", tc.r, got, tc.want)
		}
	}
}

func TestCapped(t *testing.T) {
	c := &Capped{Limit: 5}
	for _, s := range []string{"ab", "cd", "efg", "h"} {
		if n, err := c.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if string(c.Bytes()) != "abcde" || !c.Truncated() {
		t.Fatalf("kept %q, truncated %v", c.Bytes(), c.Truncated())
	}
	c = &Capped{Limit: 5}
	c.Write([]byte("abcde"))
	if c.Truncated() {
		t.Fatal("exactly the limit is not truncated")
	}
}

func FuzzParseArgs(f *testing.F) {
	for _, s := range []string{`{"command":"ls"}`, `{"command":"ls","timeout":"5"}`, `{"command":1}`, `[]`, `{"timeout":1e308}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := ParseArgs(b)
		if err != nil {
			if !errors.Is(err, ErrArgs) {
				t.Fatalf("error %v does not wrap ErrArgs", err)
			}
			return
		}
		if strings.TrimSpace(a.Command) == "" || a.Timeout <= 0 || a.Timeout > MaxTimeout ||
			a.MaxOutputSize <= 0 || a.MaxOutputSize > DefaultMaxOutputSize {
			t.Fatalf("out of range: %+v", a)
		}
	})
}
