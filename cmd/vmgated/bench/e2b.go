package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/e2bfront"
	"github.com/vmgate/vmgate/gateway/inproc"
	"github.com/vmgate/vmgate/gateway/wire"
)

// The E2B door (part "e2b"), through the wire E2B's SDKs use (plain
// HTTP to the door: the REST control plane, Connect RPC streams, /files),
// beside the same work through the local API in the same daemon:
//   - e2b_create_ms: POST /v2/sandboxes → the sandbox answers a Stat;
//     api_session_ms: a new session's first command `true`;
//   - e2b_run_ms: process.Process/Start of "true" → its end of stream;
//     api_run_ms: a session's command `true`;
//   - e2b_write_1mib_ms: POST /files (multipart) of 1 MiB → its answer;
//     api_write_1mib_ms: a file write of 1 MiB.

// e2bBench is a client of the door at url with key.
type e2bBench struct {
	url, key string
	hc       *http.Client
}

type e2bSandbox struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

func (e *e2bBench) do(ctx context.Context, method, path string, h map[string]string, body io.Reader, want int) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, body)
	if err != nil {
		return nil, err
	}
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := e.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != want {
		err = fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(data))
	}
	return data, err
}

func (e *e2bBench) create(ctx context.Context) (*e2bSandbox, error) {
	data, err := e.do(ctx, "POST", "/v2/sandboxes", map[string]string{"X-API-Key": e.key, "Content-Type": "application/json"},
		strings.NewReader(`{"templateID":"base","timeout":600}`), http.StatusCreated)
	if err != nil {
		return nil, err
	}
	var s e2bSandbox
	return &s, json.Unmarshal(data, &s)
}

func (e *e2bBench) kill(ctx context.Context, s *e2bSandbox) error {
	_, err := e.do(ctx, "DELETE", "/sandboxes/"+s.SandboxID, map[string]string{"X-API-Key": e.key}, nil, http.StatusNoContent)
	return err
}

func (e *e2bBench) envd(s *e2bSandbox, contentType string) map[string]string {
	return map[string]string{"E2b-Sandbox-Id": s.SandboxID, "X-Access-Token": s.EnvdAccessToken, "Content-Type": contentType,
		"Connect-Protocol-Version": "1"}
}

func (e *e2bBench) stat(ctx context.Context, s *e2bSandbox) error {
	_, err := e.do(ctx, "POST", "/filesystem.Filesystem/Stat", e.envd(s, "application/json"), strings.NewReader(`{"path":"/"}`), http.StatusOK)
	return err
}

// run starts cmd as the SDK's commands.run does and reads its stream to
// the end-of-stream envelope, which must carry no error, after an end
// event with exit code 0.
func (e *e2bBench) run(ctx context.Context, s *e2bSandbox, cmd string) error {
	msg, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "/bin/bash", "args": []string{"-l", "-c", cmd}}, "stdin": false})
	frame := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
	copy(frame[5:], msg)
	h := e.envd(s, "application/connect+json")
	h["Connect-Timeout-Ms"] = "60000"
	data, err := e.do(ctx, "POST", "/process.Process/Start", h, bytes.NewReader(frame), http.StatusOK)
	if err != nil {
		return err
	}
	var ended bool
	for len(data) >= 5 {
		n := binary.BigEndian.Uint32(data[1:5])
		if int(n) > len(data)-5 {
			return errors.New("start: a cut envelope")
		}
		body := data[5 : 5+n]
		if data[0]&2 != 0 {
			if !ended || string(body) != "{}" {
				return fmt.Errorf("start: the stream ended with %s (end event seen: %v)", body, ended)
			}
			return nil
		}
		ended = ended || bytes.Contains(body, []byte(`"end":{"exitCode":0`))
		data = data[5+n:]
	}
	return errors.New("start: no end-of-stream envelope")
}

func (e *e2bBench) write(ctx context.Context, s *e2bSandbox, path string, content []byte) error {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	part, err := mw.CreateFormFile("file", path)
	if err != nil {
		return err
	}
	_, _ = part.Write(content)
	_ = mw.Close()
	_, err = e.do(ctx, "POST", "/files?path="+path, e.envd(s, mw.FormDataContentType()), &body, http.StatusOK)
	return err
}

// e2b measures the door (see above) in a daemon of its own.
func (r *execRun) e2b(ctx context.Context) error {
	o, rep := r.o, r.rep
	dir := filepath.Join(r.work, "e2b")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	key := e2bfront.NewKey()
	keys := filepath.Join(dir, "e2b_keys")
	if err := os.WriteFile(keys, []byte(e2bfront.FormatLine("default", key, "bench")), 0o600); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	d, err := inproc.Start(ctx, inproc.Options{Dir: dir, ImageDir: o.ImageDir, TemplateDir: o.TemplateDir,
		Policy: withASLR(sessionPolicy(4), o.GuestASLR), MaxVMs: 4, PoolSize: 1, Ahead: o.Ahead, Accel: o.Accel, TBSizeMiB: o.TBSizeMiB, Log: o.Log,
		E2B: &e2bfront.Config{Listeners: []net.Listener{ln}, Keys: keys}})
	if err != nil {
		_ = ln.Close()
		return err
	}
	defer d.Stop()
	e := &e2bBench{url: "http://" + ln.Addr().String(), key: key, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}}
	runs := min(o.Runs, 10)
	var create, session, run, apiRun, write, apiWrite []time.Duration
	for i := range runs {
		if err := d.WaitPool(ctx, 1); err != nil {
			return err
		}
		r.step("e2b: create %d/%d", i+1, runs)
		t0 := time.Now()
		s, err := e.create(ctx)
		if err == nil {
			err = e.stat(ctx, s)
		}
		if err != nil {
			return fmt.Errorf("e2b create: %w", err)
		}
		create = append(create, time.Since(t0))
		if err := e.kill(ctx, s); err != nil {
			return err
		}
		if err := d.WaitPool(ctx, 1); err != nil {
			return err
		}
		name := fmt.Sprintf("api%d", i)
		t0 = time.Now()
		if _, err := d.Client.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}, Session: name}, client.ExecIO{}); err != nil {
			return fmt.Errorf("session: %w", err)
		}
		session = append(session, time.Since(t0))
		if err := d.Client.EndSession(ctx, name); err != nil {
			return err
		}
	}
	s, err := e.create(ctx)
	if err != nil {
		return err
	}
	defer e.kill(context.WithoutCancel(ctx), s)
	mib := make([]byte, 1<<20)
	_, _ = rand.Read(mib)
	// The local API's session, made before its commands are timed.
	if _, err := d.Client.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}, Session: "api-run"}, client.ExecIO{}); err != nil {
		return err
	}
	r.step("e2b: %d commands and 1 MiB writes, and as many through the local API", runs)
	for range runs {
		t0 := time.Now()
		if err := e.run(ctx, s, "true"); err != nil {
			return fmt.Errorf("e2b run: %w", err)
		}
		run = append(run, time.Since(t0))
		t0 = time.Now()
		if _, err := d.Client.Exec(ctx, wire.ExecRequest{Argv: []string{"true"}, Session: "api-run"}, client.ExecIO{}); err != nil {
			return err
		}
		apiRun = append(apiRun, time.Since(t0))
		t0 = time.Now()
		if err := e.write(ctx, s, "bench.dat", mib); err != nil {
			return fmt.Errorf("e2b write: %w", err)
		}
		write = append(write, time.Since(t0))
		t0 = time.Now()
		if _, err := d.Client.FileWrite(ctx, "api-run", wire.FileRequest{Path: "bench.dat"}, 0, bytes.NewReader(mib)); err != nil {
			return err
		}
		apiWrite = append(apiWrite, time.Since(t0))
	}
	_ = d.Client.EndSession(ctx, "api-run")
	rep.E2BCreateMS, rep.APISessionMS = summarize(create), summarize(session)
	rep.E2BRunMS, rep.APIRunMS = summarize(run), summarize(apiRun)
	rep.E2BWrite1MiBMS, rep.APIWrite1MiBMS = summarize(write), summarize(apiWrite)
	return nil
}
