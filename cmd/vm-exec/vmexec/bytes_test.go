package vmexec

import (
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/vmgate/vmgate/gateway/wire"
)

// fakeDaemon serves POST /v1/exec on a Unix socket: it reads each request
// as the daemon does (wire.DecodeExecRequest), keeps it, and refuses it
// as denied, so that vm-exec exits at once with 201.
func fakeDaemon(t *testing.T) (string, *[]*wire.ExecRequest) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "gw.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var got []*wire.ExecRequest
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := wire.DecodeExecRequest(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(wire.Error{Code: wire.CodeBadRequest, Error: err.Error()})
			return
		}
		got = append(got, req)
		w.WriteHeader(http.StatusForbidden)
		_ = json.NewEncoder(w).Encode(wire.Error{Code: wire.CodeDenied, Error: "recorded"})
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock, &got
}

// TestBytesReachTheDaemon: vm-exec sends its arguments, its -e values
// (given or taken from its environment) and its -c string byte for byte,
// every byte but NUL included: the daemon reads what the command line
// held. Before the base64 form each invalid UTF-8 byte arrived as U+FFFD.
func TestBytesReachTheDaemon(t *testing.T) {
	var all []byte
	for b := 1; b <= 0xff; b++ {
		all = append(all, byte(b))
	}
	t.Setenv("VMEXEC_TEST_BYTES", "\xfd\x80")
	for _, c := range []struct {
		name  string
		args  []string
		argv  []string
		env   []string
		shell bool
	}{
		{name: "arguments", args: []string{"printf", "%s", "\xff\xfe", "a\x80b", "é"}, argv: []string{"printf", "%s", "\xff\xfe", "a\x80b", "é"}},
		{name: "every byte", args: []string{"printf", "%s", string(all)}, argv: []string{"printf", "%s", string(all)}},
		{name: "shell string", args: []string{"-c", "printf '%s' '\xff'"}, argv: []string{"printf '%s' '\xff'"}, shell: true},
		{name: "env values", args: []string{"-e", "K=\xfe", "-e", "VMEXEC_TEST_BYTES", "env"}, argv: []string{"env"},
			env: []string{"K=\xfe", "VMEXEC_TEST_BYTES=\xfd\x80"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sock, got := fakeDaemon(t)
			if code := Run(append([]string{"--socket", sock, "-n"}, c.args...)); code != wire.ExitDenied || len(*got) != 1 {
				t.Fatalf("exit %d, %d requests read; want %d after one", code, len(*got), wire.ExitDenied)
			}
			req := (*got)[0]
			if !reflect.DeepEqual([]string(req.Argv), c.argv) || !reflect.DeepEqual([]string(req.Env), c.env) || req.Shell != c.shell {
				t.Errorf("daemon read argv %q env %q shell %v; want %q %q %v", req.Argv, req.Env, req.Shell, c.argv, c.env, c.shell)
			}
		})
	}
}

// TestTextFieldsRefused: what the request carries only as text (the
// working directory, a transfer's guest path) is refused when it is not
// UTF-8, as a usage error, before anything is sent: encoded, it would
// reach the daemon as another path.
func TestTextFieldsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"-w", "/tmp/\xff", "pwd"},
		{"--get", "/tmp/\xff:" + filepath.Join(t.TempDir(), "x"), "true"},
	} {
		sock, got := fakeDaemon(t)
		if code := Run(append([]string{"--socket", sock, "-n"}, args...)); code != wire.ExitUsage || len(*got) != 0 {
			t.Errorf("%q: exit %d, %d requests sent; want %d and none", args, code, len(*got), wire.ExitUsage)
		}
	}
}
