package gateway_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/e2bfront"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/internal/testutil"
)

const e2bPolicy = `version = 1

[[profile]]
name = "e2b"
match = { e2b = true }
allow_shell = true
users = ["agent", "root"]
env = ["FOO", "BAR", "LANG", "LC_ALL"]  # a terminal (pty.create) sends LANG and LC_ALL
max_vms = 4
[profile.timeout]
default = "60s"
max = "10m"
[profile.sessions]
allowed = true
idle_timeout = "10m"
max_lifetime = "30m"
max_commands = 16
[profile.files]
put_max_bytes = 16777216
get_max_bytes = 16777216

[[profile]]
name = "tiny"
match = { e2b = true }
allow_shell = true
max_vms = 1
[profile.sessions]
allowed = true
idle_timeout = "10m"
max_lifetime = "30m"
`

// e2bDoor is a daemon with an E2B door on loopback, and its keys.
type e2bDoor struct {
	url, key, other, tiny string
	audit                 string
	keys                  string
	d                     *gatewaytest.Daemon
	tokens                map[string]string // access tokens of sandboxes the tests made
}

func startE2B(t *testing.T) *e2bDoor {
	t.Helper()
	dir := t.TempDir()
	door := &e2bDoor{key: e2bfront.NewKey(), other: e2bfront.NewKey(), tiny: e2bfront.NewKey(), keys: filepath.Join(dir, "e2b_keys"),
		tokens: map[string]string{}}
	text := e2bfront.FormatLine("e2b", door.key, "conformance") + e2bfront.FormatLine("e2b", door.other, "another key") +
		e2bfront.FormatLine("tiny", door.tiny, "one VM")
	if err := os.WriteFile(door.keys, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	door.serve(t, "")
	return door
}

// serve starts the door's daemon, in stateDir when it is set (a restart).
func (door *e2bDoor) serve(t *testing.T, stateDir string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	door.url = "http://" + ln.Addr().String()
	door.d = gatewaytest.Start(t, e2bPolicy, func(c *gateway.Config) {
		c.E2B = &e2bfront.Config{Listeners: []net.Listener{ln}, Keys: door.keys}
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir, c.MaxVMs = false, 1, testutil.TemplateDir(t), 4
		c.QueueWait = 5 * time.Second // a create past a limit waits this long for a VM
		if stateDir != "" {
			c.VM.StateDir = stateDir
		}
	})
	door.audit = door.d.AuditPath
}

// TestGateway_E2B runs the official E2B SDK against the door
// (testdata/sdk/conformance.mjs), then the bad input a door must refuse,
// on one daemon.
func TestGateway_E2B(t *testing.T) {
	node, npm := nodeTools(t)
	door := startE2B(t)

	t.Run("sdk conformance", func(t *testing.T) {
		sdk := installSDK(t, npm)
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, node, "conformance.mjs")
		cmd.Dir = sdk
		cmd.Env = append(os.Environ(), "E2B_API_URL="+door.url, "E2B_SANDBOX_URL="+door.url, "E2B_API_KEY="+door.key,
			"E2B_DEBUG=", "RUN_ID="+strconv.FormatInt(time.Now().UnixNano(), 36))
		out, err := cmd.CombinedOutput()
		t.Logf("conformance.mjs:\n%s", out)
		if err != nil {
			t.Fatalf("conformance.mjs: %v (the FAIL lines above say which checks)", err)
		}
		if n := len(regexp.MustCompile(`(?m)^ok `).FindAll(out, -1)); n != 14 {
			t.Fatalf("%d checks passed, want 14", n)
		}
	})

	t.Run("audit names the key and the sandbox", func(t *testing.T) {
		data, err := os.ReadFile(door.audit)
		if err != nil {
			t.Fatal(err)
		}
		fp := e2bfront.Fingerprint(door.key)
		var sessions, fileOps, lifecycle int
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			var rec audit.Record
			if err := json.Unmarshal(line, &rec); err != nil {
				t.Fatal(err)
			}
			if rec.SSH == nil || rec.SSH.Door != "e2b" {
				continue
			}
			if rec.SSH.Fingerprint != fp && rec.SSH.Fingerprint != e2bfront.Fingerprint(door.other) && rec.SSH.Fingerprint != e2bfront.Fingerprint(door.tiny) {
				t.Fatalf("a record names an unknown key: %s", line)
			}
			if strings.HasPrefix(rec.Session, "sbx-") {
				sessions++
			}
			if rec.File != nil {
				fileOps++
			}
			if strings.HasPrefix(rec.Message, "e2b sandbox ") && strings.HasPrefix(rec.Session, "sbx-") {
				lifecycle++ // 3 creates, a timeout, 2 connects, a fork
			}
		}
		if bytes.Contains(data, []byte(door.key)) {
			t.Fatal("the audit log holds an API key")
		}
		if sessions < 20 || fileOps < 10 || lifecycle < 7 {
			t.Fatalf("%d records of sandboxes, %d file operations, %d lifecycle calls: the door's calls are not audited", sessions, fileOps, lifecycle)
		}
	})

	t.Run("bad input", func(t *testing.T) { e2bBadInput(t, door) })
	t.Run("deadlines and networks", func(t *testing.T) { e2bLifecycle(t, door) })
	t.Run("a paused sandbox outlives the daemon", func(t *testing.T) { e2bRestart(t, door) })
}

// e2bRestart: a sandbox the daemon's stop paused is the key's after a
// start on the same state, its files and its token kept.
func e2bRestart(t *testing.T, door *e2bDoor) {
	key := map[string]string{"X-API-Key": door.key, "Content-Type": "application/json"}
	status, body := e2bCall(t, "POST", door.url+"/v2/sandboxes", key, []byte(`{"timeout":600,"metadata":{"kept":"yes"}}`))
	if status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	var sbx struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(body), &sbx); err != nil {
		t.Fatal(err)
	}
	envd := map[string]string{"E2b-Sandbox-Id": sbx.SandboxID, "X-Access-Token": sbx.EnvdAccessToken}
	if status, body := e2bCall(t, "POST", door.url+"/files?path=kept.txt", map[string]string{"E2b-Sandbox-Id": sbx.SandboxID,
		"X-Access-Token": sbx.EnvdAccessToken, "Content-Type": "application/octet-stream"}, []byte("before the restart")); status != 200 {
		t.Fatalf("write: %d %s", status, body)
	}
	state := door.d.Config.VM.StateDir
	door.d.StopAndCheck(t)
	door.serve(t, state)
	status, body = e2bCall(t, "GET", door.url+"/sandboxes/"+sbx.SandboxID, key, nil)
	if status != 200 || !strings.Contains(body, `"state":"paused"`) || !strings.Contains(body, `"kept":"yes"`) {
		t.Fatalf("after the restart: %d %s", status, body)
	}
	if status, body := e2bCall(t, "POST", door.url+"/v2/sandboxes/"+sbx.SandboxID+"/connect", key, []byte(`{"timeout":60}`)); status != 201 {
		t.Fatalf("connect (resume): %d %s", status, body)
	}
	if status, body := e2bCall(t, "GET", door.url+"/files?path=kept.txt", envd, nil); status != 200 || body != "before the restart" {
		t.Fatalf("read after the restart: %d %q", status, body)
	}
	if status, _ := e2bCall(t, "DELETE", door.url+"/sandboxes/"+sbx.SandboxID, key, nil); status != 204 {
		t.Fatalf("kill: %d", status)
	}
}

// e2bLifecycle: a sandbox's deadline ends it, or pauses it with
// autoPause; a create that turns the internet off locks the session's
// network, as the audit log shows.
func e2bLifecycle(t *testing.T, door *e2bDoor) {
	key := map[string]string{"X-API-Key": door.key, "Content-Type": "application/json"}
	create := func(body string) string {
		t.Helper()
		status, out := e2bCall(t, "POST", door.url+"/v2/sandboxes", key, []byte(body))
		if status != 201 {
			t.Fatalf("create %s: %d %s", body, status, out)
		}
		var sbx struct{ SandboxID, EnvdAccessToken string }
		if err := json.Unmarshal([]byte(out), &sbx); err != nil {
			t.Fatal(err)
		}
		door.tokens[sbx.SandboxID] = sbx.EnvdAccessToken
		return sbx.SandboxID
	}
	ends := create(`{"timeout":2}`)
	pauses := create(`{"timeout":2,"autoPause":true}`)
	offline := create(`{"timeout":300,"allow_internet_access":false}`)
	defer e2bCall(t, "DELETE", door.url+"/sandboxes/"+pauses, key, nil)
	defer e2bCall(t, "DELETE", door.url+"/sandboxes/"+offline, key, nil)
	// The deadlines pass; the door acts on them (a pause takes a while
	// under TCG).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		s1, _ := e2bCall(t, "GET", door.url+"/sandboxes/"+ends, key, nil)
		s2, info := e2bCall(t, "GET", door.url+"/sandboxes/"+pauses, key, nil)
		if s1 == 404 && s2 == 200 && strings.Contains(info, `"state":"paused"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2 min after their deadlines: the plain sandbox answers %d, the autoPause one %d %s", s1, s2, info)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// A process's time limit is its stream's Connect-Timeout-Ms.
	status, out := e2bCall(t, "POST", door.url+"/process.Process/Start", map[string]string{"E2b-Sandbox-Id": offline,
		"X-Access-Token": door.tokens[offline], "Content-Type": "application/connect+json", "Connect-Timeout-Ms": "1500"},
		e2bEnvelope(`{"process":{"cmd":"/bin/bash","args":["-l","-c","sleep 60"]}}`))
	if status != 200 || !strings.Contains(out, `"end":{"exitCode":-1,"exited":false,"status":"signal: KILL (its time limit ended it)"`) {
		t.Fatalf("a process past its Connect-Timeout-Ms: %d %q", status, out)
	}
	data, err := os.ReadFile(door.audit)
	if err != nil {
		t.Fatal(err)
	}
	var locked, expired bool
	for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var rec audit.Record
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatal(err)
		}
		locked = locked || rec.Session == offline && strings.HasPrefix(rec.Message, "net-lock: allow []")
		expired = expired || rec.Session == ends && rec.Message == "e2b sandbox timed out: ended"
	}
	if !locked || !expired {
		t.Fatalf("audit: the offline sandbox's network lock %v, the ended one's timeout %v", locked, expired)
	}
}

func nodeTools(t *testing.T) (node, npm string) {
	t.Helper()
	node, err1 := exec.LookPath("node")
	npm, err2 := exec.LookPath("npm")
	if err1 != nil || err2 != nil {
		testutil.SkipOrFail(t, "node or npm not installed: the E2B SDK conformance test needs Node.js 20.18 or later")
	}
	out, err := exec.Command(node, "--version").Output()
	m := regexp.MustCompile(`^v(\d+)\.(\d+)`).FindStringSubmatch(string(out))
	if err != nil || m == nil {
		t.Fatalf("node --version: %q %v", out, err)
	}
	major, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	if major < 20 || major == 20 && minor < 18 {
		t.Fatalf("node %s: the E2B SDK needs 20.18 or later", strings.TrimSpace(string(out)))
	}
	return node, npm
}

// installSDK installs testdata/sdk's pinned SDK into a directory of the
// test's with the script.
func installSDK(t *testing.T, npm string) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"package.json", "conformance.mjs"} {
		data, err := os.ReadFile(filepath.Join("e2bfront", "testdata", "sdk", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "install", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm install: %v\n%s", err, out)
	}
	return dir
}

// e2bCall makes one call on the door and returns its status and body.
func e2bCall(t *testing.T, method, url string, headers map[string]string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

func e2bEnvelope(msg string) []byte {
	out := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(out[1:], uint32(len(msg)))
	copy(out[5:], msg)
	return out
}

func e2bBadInput(t *testing.T, door *e2bDoor) {
	key := map[string]string{"X-API-Key": door.key, "Content-Type": "application/json"}
	// One sandbox of the key's for the calls that need one.
	status, body := e2bCall(t, "POST", door.url+"/v2/sandboxes", key, []byte(`{"templateID":"base","timeout":300}`))
	if status != 201 {
		t.Fatalf("create: %d %s", status, body)
	}
	var sbx struct{ SandboxID, EnvdAccessToken string }
	if err := json.Unmarshal([]byte(body), &sbx); err != nil {
		t.Fatal(err)
	}
	defer e2bCall(t, "DELETE", door.url+"/sandboxes/"+sbx.SandboxID, key, nil)
	envd := func(extra map[string]string) map[string]string {
		h := map[string]string{"E2b-Sandbox-Id": sbx.SandboxID, "X-Access-Token": sbx.EnvdAccessToken, "Content-Type": "application/json"}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	stat := []byte(`{"path":"/etc/hostname"}`)
	if status, body := e2bCall(t, "POST", door.url+"/filesystem.Filesystem/Stat", envd(nil), stat); status != 200 {
		t.Fatalf("a good Stat: %d %s", status, body)
	}
	bigMeta := `{"templateID":"base","metadata":{"k":"` + strings.Repeat("x", 2<<20) + `"}}`
	for _, tt := range []struct {
		name, method, path string
		headers            map[string]string
		body               string
		status             int
		want               string
	}{
		{"no key", "POST", "/v2/sandboxes", map[string]string{"Content-Type": "application/json"}, `{}`, 401, "no API key"},
		{"a wrong key", "POST", "/v2/sandboxes", map[string]string{"X-API-Key": e2bfront.NewKey()}, `{}`, 401, "not known"},
		{"another key's sandbox", "GET", "/sandboxes/" + sbx.SandboxID, map[string]string{"X-API-Key": door.other}, ``, 404, "not found"},
		{"another key's kill", "DELETE", "/sandboxes/" + sbx.SandboxID, map[string]string{"X-API-Key": door.other}, ``, 404, "not found"},
		{"a template outside the profile", "POST", "/v2/sandboxes", key, `{"templateID":"ubuntu"}`, 403, "images"},
		{"a body over the limit", "POST", "/v2/sandboxes", key, bigMeta, 413, "over"},
		{"a malformed body", "POST", "/v2/sandboxes", key, `{"templateID":`, 400, "request body"},
		{"an env var the profile refuses", "POST", "/v2/sandboxes", key, `{"envVars":{"SECRET":"x"}}`, 403, "SECRET"},
		{"a secret outside the profile", "POST", "/v2/sandboxes", key, `{"envVars":{"GH_TOKEN":"vmgate:secret"}}`, 403, `GH_TOKEN\" is not one of the profile's secrets (none)`},
		{"a Host of another name", "GET", "/sandboxes/" + sbx.SandboxID, map[string]string{"X-API-Key": door.key, "Host": "rebound.example:80"}, ``, 403, "Host"},
		{"a browser's request", "GET", "/sandboxes/" + sbx.SandboxID, map[string]string{"X-API-Key": door.key, "Origin": "http://evil.example"}, ``, 403, "browser"},
		{"a wrong access token", "POST", "/filesystem.Filesystem/Stat", envd(map[string]string{"X-Access-Token": "0123"}), string(stat), 401, "unauthenticated"},
		{"no sandbox id", "POST", "/filesystem.Filesystem/Stat", map[string]string{"X-Access-Token": sbx.EnvdAccessToken, "Content-Type": "application/json"}, string(stat), 401, "E2b-Sandbox-Id"},
		{"a path out of the user's reach", "GET", "/files?path=/root/.bashrc", envd(nil), ``, 403, "permission"},
		{"a file that is not there", "GET", "/files?path=/nonexistent", envd(nil), ``, 404, "no such file"},
		{"an unknown method", "POST", "/process.Process/Nope", envd(nil), `{}`, 404, "no such endpoint"},
		{"an unknown path", "GET", "/v3/sandboxes", key, ``, 404, "no such endpoint"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, body := e2bCall(t, tt.method, door.url+tt.path, tt.headers, []byte(tt.body))
			if status != tt.status || !strings.Contains(body, tt.want) {
				t.Fatalf("%d %s, want %d ~%q", status, truncateBody(body), tt.status, tt.want)
			}
			if tt.path == "/v2/sandboxes" || strings.HasPrefix(tt.path, "/sandboxes") {
				var e struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				}
				if err := json.Unmarshal([]byte(body), &e); err != nil || e.Code != status || e.Message == "" {
					t.Fatalf("the SDKs read {code, message}: %s", body)
				}
			}
		})
	}

	t.Run("a malformed stream frame", func(t *testing.T) {
		h := envd(map[string]string{"Content-Type": "application/connect+json"})
		for name, frame := range map[string][]byte{
			"cut":        e2bEnvelope(`{"process":{"cmd":"true"}}`)[:9],
			"compressed": append([]byte{1}, e2bEnvelope(`{}`)[1:]...),
			"not json":   e2bEnvelope(`{"process":`),
		} {
			status, body := e2bCall(t, "POST", door.url+"/process.Process/Start", h, frame)
			// Errors of a stream are its end-of-stream envelope, status 200.
			if status != 200 || len(body) < 5 || body[0] != 2 || !strings.Contains(body, `"invalid_argument"`) {
				t.Errorf("%s: %d %q", name, status, body)
			}
		}
	})

	t.Run("a create past the profile's limits", func(t *testing.T) {
		tiny := map[string]string{"X-API-Key": door.tiny, "Content-Type": "application/json"}
		status, body := e2bCall(t, "POST", door.url+"/v2/sandboxes", tiny, []byte(`{}`))
		if status != 201 {
			t.Fatalf("the first: %d %s", status, body)
		}
		var first struct{ SandboxID string }
		_ = json.Unmarshal([]byte(body), &first)
		defer e2bCall(t, "DELETE", door.url+"/sandboxes/"+first.SandboxID, tiny, nil)
		status, body = e2bCall(t, "POST", door.url+"/v2/sandboxes", tiny, []byte(`{}`))
		if status != 429 || !strings.Contains(body, "max_vms = 1") {
			t.Fatalf("the second: %d %s, want a refusal naming max_vms", status, truncateBody(body))
		}
		// Nothing is left of the refused one.
		status, body = e2bCall(t, "GET", door.url+"/v2/sandboxes", tiny, nil)
		if status != 200 || strings.Count(body, `"sandboxID"`) != 1 {
			t.Fatalf("list after a refused create: %d %s", status, body)
		}
	})
}

func truncateBody(s string) string {
	if len(s) > 300 {
		return s[:300] + fmt.Sprintf("… (%d bytes)", len(s))
	}
	return s
}
