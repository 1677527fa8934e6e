package e2bfront

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/policy"
)

func TestParseKeys(t *testing.T) {
	k1, k2 := NewKey(), NewKey()
	good := "# keys\n\n" + FormatLine("agent", k1, "alice laptop") + FormatLine("ops", k2, "")
	ks, err := ParseKeys("keys", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if ks.Len() != 2 {
		t.Fatalf("%d keys", ks.Len())
	}
	if e := ks.Lookup(k1); e == nil || e.Profile != "agent" || e.Comment != "alice laptop" || e.Line != 3 || e.Fingerprint != Fingerprint(k1) {
		t.Fatalf("lookup of the first key: %+v", e)
	}
	if e := ks.Lookup(k2); e == nil || e.Profile != "ops" {
		t.Fatalf("lookup of the second key: %+v", e)
	}
	if ks.Lookup(k1+"0") != nil || ks.Lookup("") != nil {
		t.Fatal("a key that is not listed was found")
	}
	if !strings.HasPrefix(k1, KeyPrefix) || len(k1) != len(KeyPrefix)+64 {
		t.Fatalf("NewKey = %q", k1)
	}
	for name, tt := range map[string]struct{ text, want string }{
		"no profile":    {k1 + "\n", `want profile="NAME"`},
		"bad profile":   {`profile="Agent!" ` + k1 + "\n", "profile name"},
		"short key":     {`profile="a" e2b_abc` + "\n", "32 to 256"},
		"no key":        {`profile="a"` + "\n", "32 to 256"},
		"twice":         {FormatLine("a", k1, "") + FormatLine("b", k1, ""), "the key of line 1 again"},
		"control chars": {`profile="a" ` + k1 + " bad\x01comment\n", "control characters"},
	} {
		_, err := ParseKeys("f", []byte(tt.text))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ~%q", name, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), k1) {
			t.Errorf("%s: the message quotes the key: %v", name, err)
		}
	}
}

func TestLoadKeysModes(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "keys")
	if err := os.WriteFile(p, []byte(FormatLine("a", NewKey(), "")), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeys(p); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a keys file group may read: %v", err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeys(p); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKeys(dir); err == nil {
		t.Fatal("a directory was read as a keys file")
	}
}

func FuzzParseKeys(f *testing.F) {
	f.Add([]byte(FormatLine("agent", NewKey(), "c")))
	f.Add([]byte("profile=\"a\" " + strings.Repeat("x", 40) + "\n#\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ks, err := ParseKeys("f", data)
		if err != nil {
			return
		}
		for _, k := range ks.All() {
			if !profileRE.MatchString(k.Profile) || !strings.HasPrefix(k.Fingerprint, "SHA256:") {
				t.Fatalf("parsed %+v", k)
			}
		}
	})
}

func frame(flags byte, msg string) []byte { return envelope(flags, []byte(msg)) }

func TestReadEnvelope(t *testing.T) {
	var req startRequest
	if err := readEnvelope(bytes.NewReader(frame(0, `{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"}},"stdin":false,"unknown":1}`)), &req); err != nil {
		t.Fatal(err)
	}
	if req.Process.Cmd != "/bin/bash" || req.Process.Args[2] != "echo hi" || req.Process.Envs["A"] != "1" || req.Stdin == nil || *req.Stdin {
		t.Fatalf("%+v", req)
	}
	huge := make([]byte, 5)
	binary.BigEndian.PutUint32(huge[1:], maxEnvelope+1)
	for name, tt := range map[string]struct {
		in   []byte
		code string
	}{
		"empty":      {nil, codeInvalidArgument},
		"short head": {[]byte{0, 0}, codeInvalidArgument},
		"cut body":   {frame(0, `{"process":{}}`)[:8], codeInvalidArgument},
		"compressed": {frame(flagCompressed, `{}`), codeInvalidArgument},
		"end flag":   {frame(flagEndStream, `{}`), codeInvalidArgument},
		"too big":    {huge, codeResourceExhausted},
		"not json":   {frame(0, `{"process":`), codeInvalidArgument},
	} {
		err := readEnvelope(bytes.NewReader(tt.in), &req)
		if re := asRPC(err); err == nil || re.Code != tt.code {
			t.Errorf("%s: %v, want code %s", name, err, tt.code)
		}
	}
}

func FuzzReadEnvelope(f *testing.F) {
	f.Add(frame(0, `{"process":{"pid":3}}`))
	f.Add([]byte{0, 0, 0, 0, 2, '{', '}'})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req connectRequest
		_ = readEnvelope(bytes.NewReader(data), &req)
	})
}

// readFrames splits a stream answer into its envelopes.
func readFrames(t *testing.T, b []byte) (flags []byte, msgs []string) {
	t.Helper()
	for len(b) > 0 {
		if len(b) < 5 {
			t.Fatalf("a cut envelope: %q", b)
		}
		n := binary.BigEndian.Uint32(b[1:5])
		flags = append(flags, b[0])
		msgs = append(msgs, string(b[5:5+n]))
		b = b[5+n:]
	}
	return flags, msgs
}

func TestStreamFraming(t *testing.T) {
	rec := httptest.NewRecorder()
	s := startStream(rec)
	code := 3
	_ = s.send(processEvent{Event: eventOneof{Start: &startEvent{PID: 42}}})
	_ = s.send(processEvent{Event: eventOneof{Data: &dataEvent{Stdout: []byte("hi\n")}}})
	_ = s.send(processEvent{Event: eventOneof{Keepalive: &struct{}{}}})
	_ = s.send(processEvent{Event: eventOneof{End: endOf(wire.Proc{State: wire.ProcExited, ExitCode: &code})}})
	s.end(nil)
	s.end(rpcErr(codeInternal, "twice")) // the stream has ended: nothing more
	if ct := rec.Header().Get("Content-Type"); ct != "application/connect+json" || rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, ct)
	}
	flags, msgs := readFrames(t, rec.Body.Bytes())
	want := []string{`{"event":{"start":{"pid":42}}}`, `{"event":{"data":{"stdout":"aGkK"}}}`, `{"event":{"keepalive":{}}}`,
		`{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}`, `{}`}
	if strings.Join(msgs, "\n") != strings.Join(want, "\n") || !bytes.Equal(flags, []byte{0, 0, 0, 0, flagEndStream}) {
		t.Fatalf("frames %v %q", flags, msgs)
	}
	// An error goes in the end-of-stream envelope, with status 200.
	rec = httptest.NewRecorder()
	startStream(rec).end(rpcErr(codeNotFound, "process with pid %d not found", 7))
	flags, msgs = readFrames(t, rec.Body.Bytes())
	if rec.Code != 200 || len(msgs) != 1 || flags[0] != flagEndStream || msgs[0] != `{"error":{"code":"not_found","message":"process with pid 7 not found"}}` {
		t.Fatalf("%d %v %q", rec.Code, flags, msgs)
	}
}

func TestWriteUnary(t *testing.T) {
	rec := httptest.NewRecorder()
	writeUnary(rec, entryResponse{Entry: &entryInfo{Name: "a", Type: fileTypeFile, Path: "/a", Size: 5, ModifiedTime: time.Unix(0, 0).UTC()}}, nil)
	var got map[string]map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != 200 {
		t.Fatal(rec.Code, err)
	}
	if got["entry"]["size"] != "5" || got["entry"]["type"] != "FILE_TYPE_FILE" || got["entry"]["modifiedTime"] != "1970-01-01T00:00:00Z" {
		t.Fatalf("%v", got)
	}
	for code, status := range map[string]int{codeNotFound: 404, codeAlreadyExists: 409, codeUnauthenticated: 401, codeResourceExhausted: 429, codeUnimplemented: 501} {
		rec := httptest.NewRecorder()
		writeUnary(rec, nil, rpcErr(code, "m"))
		if rec.Code != status || !strings.Contains(rec.Body.String(), `"code":"`+code+`"`) || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("%s: %d %s", code, rec.Code, rec.Body.String())
		}
	}
}

func TestAPIToRPC(t *testing.T) {
	api := func(status int, code, fileErr string) error {
		return &client.APIError{Status: status, Body: wire.Error{Code: code, Error: "x", FileError: fileErr}}
	}
	for _, tt := range []struct {
		err  error
		want string
	}{
		{api(404, wire.CodeNotFound, wire.FileNotFound), codeNotFound},
		{api(409, wire.CodeBadRequest, wire.FileExists), codeAlreadyExists},
		{api(403, wire.CodeBadRequest, wire.FileDenied), codePermissionDenied},
		{api(403, wire.CodeDenied, ""), codePermissionDenied},
		{api(400, wire.CodeBadRequest, ""), codeInvalidArgument},
		{api(404, wire.CodeNotFound, ""), codeNotFound},
		{api(503, wire.CodeBusy, ""), codeResourceExhausted},
		{api(503, wire.CodeShutdown, ""), codeUnavailable},
		{api(500, wire.CodeVM, ""), codeInternal},
		{net.ErrClosed, codeUnavailable},
	} {
		if got := apiToRPC("op", tt.err).Code; got != tt.want {
			t.Errorf("%v: %s, want %s", tt.err, got, tt.want)
		}
	}
}

func TestCommandOf(t *testing.T) {
	r := commandOf(&processConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo $HOME"}})
	if !r.Shell || !r.Login || len(r.Argv) != 1 || r.Argv[0] != "echo $HOME" {
		t.Fatalf("bash -l -c: %+v", r)
	}
	r = commandOf(&processConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}})
	if r.Shell || len(r.Argv) != 3 || r.Argv[0] != "/bin/bash" {
		t.Fatalf("another argv: %+v", r)
	}
	cfg := configOf(wire.Proc{Argv: []string{"bash", "-l", "-c", "sleep 9"}, Dir: "/tmp"})
	if cfg.Cmd != "/bin/bash" || strings.Join(cfg.Args, " ") != "-l -c sleep 9" || cfg.Cwd == nil || *cfg.Cwd != "/tmp" || cfg.Envs == nil {
		t.Fatalf("config of a login command: %+v", cfg)
	}
	if e := endOf(wire.Proc{State: wire.ProcExited, Signal: "KILL"}); e.ExitCode != -1 || e.Exited || e.Status != "signal: KILL" || e.Error == nil {
		t.Fatalf("end of a killed process: %+v", e)
	}
	zero := 0
	if e := endOf(wire.Proc{State: wire.ProcExited, ExitCode: &zero}); e.ExitCode != 0 || !e.Exited || e.Error != nil {
		t.Fatalf("end of a clean exit: %+v", e)
	}
}

func TestSignedURL(t *testing.T) {
	rec := sandboxRecord{Token: "tok"}
	now := time.Unix(1000, 0)
	sig := signature("/home/user/a.txt", opRead, "user", "tok", 2000)
	q := url.Values{"path": {"/home/user/a.txt"}, "username": {"user"}, "signature": {sig}, "signature_expiration": {"2000"}}
	r := httptest.NewRequest("GET", "/files?"+q.Encode(), nil)
	if !signedOK(r, opRead, rec, now) {
		t.Fatal("a good signature was refused")
	}
	if signedOK(r, opWrite, rec, now) || signedOK(r, opRead, sandboxRecord{Token: "other"}, now) || signedOK(r, opRead, rec, time.Unix(2001, 0)) {
		t.Fatal("a signature for another operation, token or time was accepted")
	}
	q.Set("path", "/etc/shadow")
	if signedOK(httptest.NewRequest("GET", "/files?"+q.Encode(), nil), opRead, rec, now) {
		t.Fatal("a signature for another path was accepted")
	}
	// The SDK's own: v1_ and unpadded base64 of SHA-256.
	if !strings.HasPrefix(sig, "v1_") || strings.HasSuffix(sig, "=") || len(sig) != 3+43 {
		t.Fatalf("signature %q", sig)
	}
}

func TestMetadataQuery(t *testing.T) {
	// As the SDK sends it: each key and value escaped, joined as a
	// query, escaped again in the URL.
	u, _ := url.Parse("/v2/sandboxes?metadata=k%3Dv%252520w%26suite%3Dx&state=running,paused&limit=10")
	m, err := parseMetadataQuery(u.Query().Get("metadata"))
	if err != nil || m["k"] != "v w" || m["suite"] != "x" || len(m) != 2 {
		t.Fatalf("%v %v", m, err)
	}
	if !hasMetadata(map[string]string{"k": "v w", "suite": "x", "more": "1"}, m) || hasMetadata(map[string]string{"k": "v w"}, m) {
		t.Fatal("hasMetadata")
	}
}

func TestHostAllowed(t *testing.T) {
	f := &Front{hosts: map[string]bool{}}
	f.addHosts(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 3000})
	for host, want := range map[string]bool{"127.0.0.1:3000": true, "localhost:3000": true, "LOCALHOST:3000": true, "[::1]:3000": true,
		"evil.example:3000": false, "127.0.0.1:3001": false, "localhost": false, "": false} {
		if got := f.hostAllowed(host); got != want {
			t.Errorf("Host %q: %v, want %v", host, got, want)
		}
	}
	f = &Front{hosts: map[string]bool{}}
	f.addHosts(&net.UnixAddr{Name: "/run/e2b.sock", Net: "unix"})
	if !f.hostAllowed("anything") {
		t.Error("a Unix socket's Host was refused")
	}
}

func TestNarrowing(t *testing.T) {
	for name, tt := range map[string]struct {
		body   string
		allow  []string
		none   bool
		status int
	}{
		"nothing":          {`{}`, nil, true, 0},
		"no internet":      {`{"allow_internet_access":false}`, []string{}, false, 0},
		"allowOut":         {`{"network":{"allowOut":["api.example.com:443"],"denyOut":["0.0.0.0/0"]}}`, []string{"api.example.com:443"}, false, 0},
		"deny all":         {`{"network":{"denyOut":["0.0.0.0/0"]}}`, []string{}, false, 0},
		"deny some":        {`{"network":{"denyOut":["10.0.0.0/8"]}}`, nil, true, 400},
		"internet beats":   {`{"allow_internet_access":false,"network":{"allowOut":["x:1"]}}`, []string{}, false, 0},
		"internet allowed": {`{"allow_internet_access":true}`, nil, true, 0},
	} {
		var b createBody
		if err := json.Unmarshal([]byte(tt.body), &b); err != nil {
			t.Fatal(err)
		}
		got, status, _ := narrowing(&b)
		if status != tt.status || (got == nil) != tt.none || got != nil && strings.Join(*got, ",") != strings.Join(tt.allow, ",") {
			t.Errorf("%s: %v %d", name, got, status)
		}
	}
}

func TestBasicUser(t *testing.T) {
	for h, want := range map[string]string{"": "", "Basic cm9vdDo=": "root", "Basic dXNlcjo=": "user"} {
		if got, err := basicUser(h); err != nil || got != want {
			t.Errorf("%q: %q %v", h, got, err)
		}
	}
	if _, err := basicUser("Bearer x"); err == nil {
		t.Error("a bearer token was read as a user")
	}
	if mapUser("user") != "" || mapUser("root") != "root" {
		t.Error("mapUser")
	}
}

// fakeCore is a Core for New's checks: a policy, and nothing behind it.
type fakeCore struct{ pol *policy.Policy }

func (c fakeCore) Policy() *policy.Policy                    { return c.pol }
func (c fakeCore) Audit(audit.Record) error                  { return nil }
func (c fakeCore) ListenUnix(p string) (net.Listener, error) { return net.Listen("unix", p) }
func (c fakeCore) Dial(context.Context, policy.Identity) (net.Conn, error) {
	return nil, errors.New("no daemon")
}

func TestNewRefuses(t *testing.T) {
	pol, err := policy.Parse("p.toml", []byte(`version = 1
[[profile]]
name = "e2b"
match = { e2b = true }
[[profile]]
name = "ssh"
match = { ssh = true }
`))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", FormatLine("e2b", NewKey(), ""))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for name, tt := range map[string]struct {
		cfg  Config
		want string
	}{
		"non-loopback":      {Config{Listen: []string{"0.0.0.0:0"}, Keys: good}, "not a loopback address"},
		"host name":         {Config{Listen: []string{"localhost:0"}, Keys: good}, "not an IP address"},
		"no keys file":      {Config{Listen: []string{"127.0.0.1:0"}}, "no keys file"},
		"missing keys file": {Config{Listen: []string{"127.0.0.1:0"}, Keys: filepath.Join(dir, "nope")}, "no such file"},
		"no address":        {Config{Keys: good}, "no address"},
		"an ssh profile":    {Config{Listen: []string{"127.0.0.1:0"}, Keys: write("ssh", FormatLine("ssh", NewKey(), ""))}, "does not accept E2B keys"},
		"unknown profile":   {Config{Listen: []string{"127.0.0.1:0"}, Keys: write("nosuch", FormatLine("nosuch", NewKey(), ""))}, "not in the policy"},
	} {
		f, err := New(fakeCore{pol}, tt.cfg, dir, log)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want ~%q", name, err, tt.want)
		}
		if f != nil {
			f.CloseListeners()
		}
	}
	// Allowed: loopback, a Unix socket, and non-loopback with AllowRemote.
	sock := filepath.Join(dir, "e2b.sock")
	f, err := New(fakeCore{pol}, Config{Listen: []string{"127.0.0.1:0", "unix:" + sock}, Keys: good}, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	f.CloseListeners()
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the Unix socket is left after CloseListeners: %v", err)
	}
	f, err = New(fakeCore{pol}, Config{Listen: []string{"0.0.0.0:0"}, Keys: good, AllowRemote: true}, dir, log)
	if err != nil {
		t.Fatal(err)
	}
	f.CloseListeners()
}

// TestProcEnv: a call's variables win over the sandbox's, and those
// marked SecretMarker become secrets asked for, not variables.
func TestProcEnv(t *testing.T) {
	env, secrets := procEnv(map[string]string{"A": "1", "GH_TOKEN": SecretMarker, "B": "2"}, map[string]string{"B": "3", "NPM": SecretMarker})
	slices.Sort(env)
	if !slices.Equal(env, []string{"A=1", "B=3"}) || !slices.Equal(secrets, []string{"GH_TOKEN", "NPM"}) {
		t.Fatalf("env %q, secrets %q", env, secrets)
	}
	// A call that sets a marked variable to a value passes the value.
	env, secrets = procEnv(map[string]string{"GH_TOKEN": SecretMarker}, map[string]string{"GH_TOKEN": "x"})
	if !slices.Equal(env, []string{"GH_TOKEN=x"}) || len(secrets) != 0 {
		t.Fatalf("env %q, secrets %q", env, secrets)
	}
}
