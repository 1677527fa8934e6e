package agent

import (
	"encoding/json"
	"fmt"
	"github.com/vmgate/vmgate/internal/sshmsg"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/vm/agentproto"
)

// recordingChannel is an ssh.Channel that records what a session sends, in
// order. Writes are slow so that output still being copied when the exit
// status is sent would show up after it.
type recordingChannel struct {
	mu      sync.Mutex
	events  []string
	stdout  int
	stderr  int
	closed  chan struct{}
	closeMu sync.Once
}

func newRecordingChannel() *recordingChannel {
	return &recordingChannel{closed: make(chan struct{})}
}

func (c *recordingChannel) record(ev string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = append(c.events, ev)
}

func (c *recordingChannel) Read([]byte) (int, error) { return 0, io.EOF }

func (c *recordingChannel) Write(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stdout += len(p)
	c.events = append(c.events, "data")
	return len(p), nil
}

func (c *recordingChannel) Close() error {
	c.record("close")
	c.closeMu.Do(func() { close(c.closed) })
	return nil
}

func (c *recordingChannel) CloseWrite() error {
	c.record("eof")
	return nil
}

func (c *recordingChannel) SendRequest(name string, _ bool, payload []byte) (bool, error) {
	var m sshmsg.ExitStatusMsg
	if name == "exit-status" && ssh.Unmarshal(payload, &m) == nil {
		name = fmt.Sprintf("exit-status %d", m.Status)
	}
	c.record(name)
	return true, nil
}

func (c *recordingChannel) Stderr() io.ReadWriter { return recordingStderr{c} }

type recordingStderr struct{ c *recordingChannel }

func (s recordingStderr) Read([]byte) (int, error) { return 0, io.EOF }

func (s recordingStderr) Write(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.c.stderr += len(p)
	s.c.events = append(s.c.events, "data")
	return len(p), nil
}

// runRecorded serves one session whose requests are reqs on a recording
// channel and returns the recorded events once the session is over.
func runRecorded(t *testing.T, reqs ...*ssh.Request) *recordingChannel {
	t.Helper()
	ch := newRecordingChannel()
	in := make(chan *ssh.Request, len(reqs))
	for _, r := range reqs {
		in <- r
	}
	done := make(chan struct{})
	go func() {
		serveSession(testLogger(t), ch, in)
		close(done)
	}()
	select {
	case <-ch.closed:
	case <-time.After(testTimeout):
		t.Fatal("session never closed its channel")
	}
	close(in) // the host acknowledges the close
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("session did not finish")
	}
	return ch
}

func execReq(t *testing.T, spec agentproto.ExecSpec) *ssh.Request {
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	return &ssh.Request{Type: agentproto.ExecRequest, Payload: ssh.Marshal(agentproto.ExecPayload{JSON: string(b)})}
}

// checkOrder verifies that all output precedes EOF, which precedes the
// exit status, which precedes the close.
func checkOrder(t *testing.T, ch *recordingChannel, exit string) {
	t.Helper()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	var tail []string
	for i, ev := range ch.events {
		if ev != "data" {
			tail = ch.events[i:]
			break
		}
	}
	if got, want := strings.Join(tail, ","), "eof,"+exit+",close"; got != want {
		t.Errorf("events after the output: %s, want %s", got, want)
	}
}

func TestSessionSendsOutputBeforeExitStatus(t *testing.T) {
	t.Parallel()
	ch := runRecorded(t, execReq(t, argv("sh", "-c", "head -c 300000 /dev/zero; echo oops >&2; exit 3")))
	checkOrder(t, ch, "exit-status 3")
	if ch.stdout != 300000 || ch.stderr != 5 {
		t.Errorf("stdout %d bytes, stderr %d bytes", ch.stdout, ch.stderr)
	}
}

func TestSessionPtySendsOutputBeforeExitStatus(t *testing.T) {
	t.Parallel()
	pty := &ssh.Request{Type: "pty-req", Payload: ssh.Marshal(sshmsg.PtyRequest{Term: "dumb", Columns: 80, Rows: 24})}
	ch := runRecorded(t, pty, execReq(t, argv("sh", "-c", "stty raw; head -c 100000 /dev/zero; exit 2")))
	checkOrder(t, ch, "exit-status 2")
	if ch.stdout != 100000 {
		t.Errorf("stdout %d bytes", ch.stdout)
	}
}

func TestSessionReportsStartFailure(t *testing.T) {
	t.Parallel()
	ch := runRecorded(t, execReq(t, argv("vmgate-no-such-command")))
	checkOrder(t, ch, "exit-status 127")
}
