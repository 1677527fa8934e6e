package wire

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

var decodeCases = []struct {
	body string
	ok   bool
}{
	{`{"argv":["true"]}`, true},
	{`{"argv":["sh"],"shell":true}`, true},
	{`{"argv":["a","b"],"shell":true}`, false},
	{`{"argv":[]}`, false},
	{`{}`, false},
	{`{"argv":["x"],"timeout_ms":-1}`, false},
	{`{"argv":["x"],"unknown":1}`, false},
	{`{"argv":["x"]} {"argv":["y"]}`, false},
	{"{\"argv\":[\"a\\u0000\"]}", false},
	{"{\"argv\":[\"a\"],\"env\":[\"K=\\u0000\"]}", false},
	{`{"argv":"true"}`, false},
	{`[]`, false},
	{``, false},
	{`{"argv":["x"],"tty":{"term":"xterm","cols":80,"rows":24}}`, true},
	{`{"argv":["x"],"tty":{"cols":99999}}`, false},
	{`{"argv":["x"],"session":"s","stdin":true,"dir":"/tmp","env":["A=b"],"timeout_ms":100}`, true},
}

func TestDecodeExecRequest(t *testing.T) {
	for _, c := range decodeCases {
		_, err := DecodeExecRequest(strings.NewReader(c.body))
		if (err == nil) != c.ok {
			t.Errorf("%q: err=%v, want ok=%v", c.body, err, c.ok)
		}
	}
	huge := `{"argv":["` + strings.Repeat("a", MaxRequestBody) + `"]}`
	if _, err := DecodeExecRequest(strings.NewReader(huge)); err == nil {
		t.Error("oversized body accepted")
	}
}

func FuzzDecodeExecRequest(f *testing.F) {
	for _, c := range decodeCases {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := DecodeExecRequest(bytes.NewReader(b))
		if err != nil {
			return
		}
		if len(req.Argv) == 0 || (req.Shell && len(req.Argv) != 1) || req.TimeoutMS < 0 {
			t.Fatalf("invariant broken: %+v", req)
		}
		for _, s := range req.Argv {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatal("NUL accepted")
			}
		}
	})
}

func TestFrames(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteFrame(&buf, FrameStdout, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSONFrame(&buf, FrameResult, Result{ExitCode: 3}); err != nil {
		t.Fatal(err)
	}
	typ, p, err := ReadFrame(&buf)
	if err != nil || typ != FrameStdout || string(p) != "hello" {
		t.Fatalf("%c %q %v", typ, p, err)
	}
	typ, p, err = ReadFrame(&buf)
	if err != nil || typ != FrameResult || !strings.Contains(string(p), `"exit_code":3`) {
		t.Fatalf("%c %q %v", typ, p, err)
	}
	if _, _, err := ReadFrame(&buf); !errors.Is(err, io.EOF) {
		t.Fatalf("want EOF, got %v", err)
	}
	if err := WriteFrame(&buf, FrameStdin, make([]byte, MaxFrame+1)); err == nil {
		t.Fatal("oversized frame written")
	}
	if _, _, err := ReadFrame(bytes.NewReader([]byte{'o', 0xff, 0xff, 0xff, 0xff})); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversized header: %v", err)
	}
	if _, _, err := ReadFrame(bytes.NewReader([]byte{'o', 0, 0, 0, 9, 'x'})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("short payload: %v", err)
	}
}

// TestExitCodes: the one mapping of results and errors to exit codes that
// vm-exec, the SSH front door and the MCP tool share.
func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		r    Result
		want int
	}{
		{Result{ExitCode: 0}, 0},
		{Result{ExitCode: 7}, 7},
		{Result{ExitCode: -1, Signal: "TERM"}, 143},
		{Result{ExitCode: -1, Signal: "XCPU"}, 152},
		{Result{ExitCode: -1, Signal: "XFSZ"}, 153},
		{Result{ExitCode: -1, Signal: "NOPE"}, 128},
	} {
		if got := c.r.ShellExitCode(); got != c.want {
			t.Errorf("%+v: %d, want %d", c.r, got, c.want)
		}
	}
	for code, want := range map[string]int{
		CodeDenied: ExitDenied, CodeBusy: ExitBusy, CodeVM: ExitVMFailed, CodeTransfer: ExitTransfer,
		CodeAudit: ExitInternal, CodeBadRequest: ExitInternal, "": ExitInternal,
	} {
		if got := (Error{Code: code}).ExitCode(); got != want {
			t.Errorf("code %q: exit %d, want %d", code, got, want)
		}
	}
	// Above the guest's range, distinct, and documented in this order.
	seen := map[int]bool{}
	for _, c := range []int{ExitInternal, ExitDenied, ExitBusy, ExitTimedOut, ExitUnreachable, ExitVMFailed} {
		if c <= 128+64 || seen[c] {
			t.Errorf("exit code %d overlaps", c)
		}
		seen[c] = true
	}
}
