package mcpserver

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// fakeGateway is a stand-in for vmgated on a Unix socket: it speaks the
// local API (exec streams, sessions, holds, status) and runs no VM. Each
// exec is handed to the script its argv names (see script), which plays
// the command: output frames, a result, or a wait for the client to go.
type fakeGateway struct {
	t      *testing.T
	Client *client.Client

	mu       sync.Mutex
	sessions map[string]bool
	execs    []wire.ExecRequest
	// files is what `head -c N -- PATH` prints, by PATH.
	files map[string][]byte
	// events receives what scripts report (see the scripts).
	events chan fakeEvent
	// grant is what the status says the caller's profile grants;
	// statusGate, when set, holds the status back until it is closed.
	grant      *wire.Grant
	statusGate chan struct{}
}

// fakeEvent is something a script saw, and when.
type fakeEvent struct {
	what string
	at   time.Time
}

func startFakeGateway(t *testing.T) *fakeGateway {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fake.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	g := &fakeGateway{t: t, Client: client.New(sock), sessions: map[string]bool{}, files: map[string][]byte{},
		events: make(chan fakeEvent, 64), grant: &wire.Grant{Profile: "fake", Shell: true, Sessions: true, Network: true, Allow: []string{"example.com:443"}}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/exec", g.exec)
	mux.HandleFunc("GET /v1/sessions", func(w http.ResponseWriter, _ *http.Request) {
		g.mu.Lock()
		out := []wire.Session{}
		for n := range g.sessions {
			out = append(out, wire.Session{Name: n, VMID: "vm-" + n})
		}
		g.mu.Unlock()
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("DELETE /v1/sessions/{name}", func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.sessions[r.PathValue("name")] {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(wire.Error{Code: wire.CodeNotFound, Error: "no such session"})
			return
		}
		delete(g.sessions, r.PathValue("name"))
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/sessions/{name}/hold", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, _ *http.Request) {
		g.mu.Lock()
		grant, gate := g.grant, g.statusGate
		g.mu.Unlock()
		if gate != nil {
			<-gate
		}
		_ = json.NewEncoder(w).Encode(wire.Status{Version: "fake", Caller: grant})
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return g
}

func (g *fakeGateway) event(what string) {
	select {
	case g.events <- fakeEvent{what, time.Now()}:
	default:
		g.t.Errorf("fake gateway: event %q dropped", what)
	}
}

// waitEvent returns the next event, which must be want, within d.
func (g *fakeGateway) waitEvent(t *testing.T, want string, d time.Duration) fakeEvent {
	t.Helper()
	select {
	case e := <-g.events:
		if e.what != want {
			t.Fatalf("fake gateway: event %q, want %q", e.what, want)
		}
		return e
	case <-time.After(d):
		t.Fatalf("fake gateway: no %q within %v", want, d)
	}
	return fakeEvent{}
}

// execConn is one exec stream, for a script.
type execConn struct {
	req  wire.ExecRequest
	conn net.Conn
	// gone is closed when the client's side of the stream ended.
	gone chan struct{}
	mu   sync.Mutex
}

func (c *execConn) out(s string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return wire.WriteFrame(c.conn, wire.FrameStdout, []byte(s))
}

func (c *execConn) result(r wire.Result) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.VMID == "" {
		r.VMID = "vm-fake"
	}
	if r.RequestID == "" {
		r.RequestID = "req-fake"
	}
	return wire.WriteJSONFrame(c.conn, wire.FrameResult, r)
}

func (g *fakeGateway) exec(w http.ResponseWriter, r *http.Request) {
	var req wire.ExecRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	g.mu.Lock()
	g.execs = append(g.execs, req)
	if req.Session != "" {
		g.sessions[req.Session] = true
	}
	g.mu.Unlock()
	conn, brw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		g.t.Errorf("hijack: %v", err)
		return
	}
	defer conn.Close()
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + wire.Upgrade + "\r\n\r\n")
	_ = brw.Flush()
	c := &execConn{req: req, conn: conn, gone: make(chan struct{})}
	go func() {
		defer close(c.gone)
		br := bufio.NewReader(brw)
		for {
			if _, _, err := wire.ReadFrame(br); err != nil {
				return
			}
		}
	}()
	g.script(c)
}

// script plays the command of an exec request:
//
//	"slow N"     prints "tick I\n" every 300 ms, N times, then exits 0
//	"flood N"    prints N bytes, 64 KiB every 20 ms, then exits 0; events "flooded"
//	             once every frame and the result were written
//	"hang"       prints "started\n", then waits for the client to go;
//	             events "gone" when it did
//	"bytes N C"  prints N bytes C (a Go-quoted byte), exits 0
//	"exit N"     exits N
//	head -c N -- PATH   prints the first N bytes of files[PATH]
//	anything else       prints "ran: CMD\n", exits 0
func (g *fakeGateway) script(c *execConn) {
	cmd := strings.Join(c.req.Argv, " ")
	f := strings.Fields(cmd)
	switch {
	case len(f) == 2 && f[0] == "slow":
		n := atoi(f[1])
		for i := range n {
			select {
			case <-time.After(300 * time.Millisecond):
			case <-c.gone:
				return
			}
			_ = c.out("tick " + strconv.Itoa(i) + "\n")
		}
		_ = c.result(wire.Result{ExecMS: int64(n) * 300, TotalMS: int64(n)*300 + 5})
	case len(f) == 2 && f[0] == "flood":
		n := atoi(f[1])
		chunk := strings.Repeat("x", 64<<10)
		for n > 0 {
			k := min(n, len(chunk))
			if err := c.out(chunk[:k]); err != nil {
				return
			}
			n -= k
			time.Sleep(20 * time.Millisecond) // a command printing for a while
		}
		if c.result(wire.Result{StdoutBytes: int64(atoi(f[1]))}) == nil {
			g.event("flooded")
		}
	case cmd == "hang":
		_ = c.out("started\n")
		<-c.gone
		g.event("gone")
	case len(f) == 3 && f[0] == "bytes":
		_ = c.out(strings.Repeat(unquoteByte(f[2]), atoi(f[1])))
		_ = c.result(wire.Result{})
	case len(f) == 2 && f[0] == "exit":
		_ = c.result(wire.Result{ExitCode: atoi(f[1])})
	case len(f) == 5 && f[0] == "head" && f[1] == "-c" && f[3] == "--":
		g.mu.Lock()
		b := g.files[f[4]]
		g.mu.Unlock()
		b = b[:min(len(b), atoi(f[2]))]
		for len(b) > 0 {
			k := min(len(b), wire.MaxFrame)
			_ = c.out(string(b[:k]))
			b = b[k:]
		}
		_ = c.result(wire.Result{})
	default:
		_ = c.out("ran: " + cmd + "\n")
		_ = c.result(wire.Result{})
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// unquoteByte reads a byte written as in a Go string literal (\x01).
func unquoteByte(s string) string {
	out, err := strconv.Unquote(`"` + s + `"`)
	if err != nil {
		return s
	}
	return out
}
