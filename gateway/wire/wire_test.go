package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
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
	{`{"argv":["printf","%s",{"b64":"/w=="}],"env":[{"b64":"Sz3/"}]}`, true},
	{`{"argv":[{"b64":"/w=="}],"shell":true}`, true},
	{`{"argv":null,"session":"s","put":[{"guest":"/w","top":"t","files":1,"bytes":1}]}`, true},
	{`{"argv":[""]}`, true}, // an empty program is the policy's to refuse (audited)
	{`{"argv":["x",{"b64":"/w"}]}`, false},
	{`{"argv":["x",{"b64":"/x=="}]}`, false},
	{`{"argv":["x",{"b64":"!"}]}`, false},
	{`{"argv":["x",{"b64":"/w==","more":1}]}`, false},
	{`{"argv":["x",{"b64":"YQBi"}]}`, false}, // a NUL in base64
	{`{"argv":["x"],"env":[{"b64":"Sz0A"}]}`, false},
	{`{"argv":["x"],"env":[1]}`, false},
	{`{"argv":{"b64":"/w=="}}`, false},
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
		if len(req.Argv) == 0 && !req.TransferOnly() || (req.Shell && len(req.Argv) != 1) || req.TimeoutMS < 0 {
			t.Fatalf("invariant broken: %+v", req)
		}
		for _, s := range append(req.Argv, req.Env...) {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatal("NUL accepted")
			}
		}
		// What the daemon read, a client sends back the same: encoded
		// again, read again, it encodes to the same bytes (an empty list
		// and an absent one are the same request).
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		again, err := DecodeExecRequest(bytes.NewReader(enc))
		if err != nil {
			t.Fatalf("%s read as %+v, re-encoded as %s, refused: %v", b, req, enc, err)
		}
		if enc2, _ := json.Marshal(again); !bytes.Equal(enc, enc2) {
			t.Fatalf("%s read as %+v, re-encoded as %s, read and encoded again as %s", b, req, enc, enc2)
		}
	})
}

// TestExecRequestBytes: every byte but NUL, alone and in company, reaches
// the daemon as the client had it: in an argument, in an environment
// value, in a shell string. Before the base64 form, encoding/json turned
// each invalid byte into U+FFFD.
func TestExecRequestBytes(t *testing.T) {
	var all []byte
	for b := 1; b <= 0xff; b++ {
		all = append(all, byte(b))
		one := string([]byte{byte(b)})
		for _, req := range []ExecRequest{
			{Argv: []string{"printf", "%s", one, "a" + one + "b"}, Env: []string{"K=" + one}},
			{Argv: []string{"printf '%s' '" + one + "'"}, Shell: true},
		} {
			got := roundTrip(t, req)
			if !reflect.DeepEqual(got.Argv, req.Argv) || !reflect.DeepEqual(got.Env, req.Env) {
				t.Errorf("byte %#x: sent argv %q env %q, daemon read %q %q", b, req.Argv, req.Env, got.Argv, got.Env)
			}
		}
	}
	req := ExecRequest{Argv: []string{"x", string(all), "\xff", "�"}, Env: []string{"A=" + string(all)}}
	if got := roundTrip(t, req); !reflect.DeepEqual(got.Argv, req.Argv) || !reflect.DeepEqual(got.Env, req.Env) {
		t.Errorf("all bytes: daemon read %q %q", got.Argv, got.Env)
	}
	// Text stays in today's form: an old daemon reads what a new client
	// sends it, unless it needs the new form.
	b, _ := json.Marshal(ExecRequest{Argv: []string{"echo", "é<&>"}, Env: []string{"A=b"}})
	if want := `{"argv":["echo","é\u003c\u0026\u003e"],"env":["A=b"]}`; string(b) != want {
		t.Errorf("text request encoded as %s, want %s", b, want)
	}
}

func roundTrip(t *testing.T, req ExecRequest) *ExecRequest {
	t.Helper()
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeExecRequest(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return got
}

// TestDecodeErrorsNameTheField: a refused element is named by field and
// position.
func TestDecodeErrorsNameTheField(t *testing.T) {
	for body, want := range map[string]string{
		`{"argv":["x",{"b64":"/w"}]}`:          "argv: element 1: b64",
		`{"argv":["x"],"env":["A=b",{"b":1}]}`: "env: element 1",
		`{"argv":["x",{"b64":"YQBi"}]}`:        "NUL",
	} {
		_, err := DecodeExecRequest(strings.NewReader(body))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it to say %q", body, err, want)
		}
	}
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
		CodeAudit: ExitInternal, CodeBadRequest: ExitDenied, "": ExitInternal,
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
