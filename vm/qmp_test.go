package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestParseQMPLine(t *testing.T) {
	cases := []struct {
		line string
		ok   bool
		kind string
	}{
		{`{"QMP": {"version": {}, "capabilities": []}}`, true, "greeting"},
		{`{"return": {}}`, true, "return"},
		{`{"return": {"status": "running", "running": true}}`, true, "return"},
		{`{"error": {"class": "GenericError", "desc": "no"}}`, true, "error"},
		{`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}`, true, "event"},
		{`{}`, false, ""},
		{`not json`, false, ""},
		{`{"return": `, false, ""},
		{`[1,2]`, false, ""},
	}
	for _, c := range cases {
		r, err := parseQMPLine([]byte(c.line))
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v", c.line, err)
			continue
		}
		if !c.ok {
			continue
		}
		kind := ""
		switch {
		case r.QMP != nil:
			kind = "greeting"
		case r.Error != nil:
			kind = "error"
		case r.Return != nil:
			kind = "return"
		case r.Event != "":
			kind = "event"
		}
		if kind != c.kind {
			t.Errorf("%s: kind %s, want %s", c.line, kind, c.kind)
		}
	}
}

func FuzzParseQMPLine(f *testing.F) {
	f.Add([]byte(`{"return": {}}`))
	f.Add([]byte(`{"error": {"class": "x", "desc": "y"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = parseQMPLine(b)
	})
}

func TestNoSpace(t *testing.T) {
	cases := []struct {
		data string
		full bool
	}{
		// QEMU 7.2's event for a full host disk under werror=enospc.
		{`{"device": "root", "nospace": true, "node-name": "#block158", "reason": "No space left on device", "operation": "write", "action": "stop"}`, true},
		{`{"device": "root", "nospace": false, "reason": "Input/output error", "operation": "write", "action": "report"}`, false},
		{`{"device": "root", "operation": "read", "action": "report"}`, false},
		{`{"nospace": "yes"}`, false},
		{`[true]`, false},
		{`not json`, false},
		{``, false},
	}
	for _, c := range cases {
		ev, full := noSpace([]byte(c.data))
		if full != c.full {
			t.Errorf("%s: full = %v, want %v", c.data, full, c.full)
		}
		if full && (ev.Operation != "write" || ev.Reason == "") {
			t.Errorf("%s: event %+v", c.data, ev)
		}
	}
}

// TestWaitEventBounded: a monitor line longer than the reader's buffer
// ends the wait with an error instead of growing without end.
func TestWaitEventBounded(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	q := &qmp{r: bufio.NewReaderSize(a, 4096)}
	go func() {
		_, _ = b.Write([]byte(`{"event": "STOP"}` + "\n"))
		_, _ = b.Write(bytes.Repeat([]byte("x"), 10000))
	}()
	err := q.readUntil("BLOCK_IO_ERROR", func(qmpReply) bool { return true })
	if !errors.Is(err, errQMPLineTooLong) || !strings.Contains(err.Error(), "(4096 bytes)") {
		t.Fatalf("waitEvent: %v", err)
	}
}

// endlessLine is how much of a line without end the fake QEMU of
// TestQMPEndlessLine sends at most: far over qmpMaxLine, and more than
// the bound on what the daemon may allocate for it.
const endlessLine = 32 << 20

// hijackedQMP serves one connection on a QMP socket in a temporary directory
// as a QEMU taken over by its guest would: it sends the greeting (unless
// endlessGreeting) and answers qmp_capabilities, then starts a line that
// does not end, in place of the greeting or of the next command's reply.
// It returns the socket's path and a channel that gets how many bytes of
// the endless line were written before the daemon's side closed.
func hijackedQMP(t *testing.T, endlessGreeting bool) (string, <-chan int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	sent := make(chan int, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			sent <- 0
			return
		}
		defer c.Close()
		r := bufio.NewReader(c)
		if !endlessGreeting {
			fmt.Fprintln(c, `{"QMP": {"version": {}, "capabilities": []}}`)
			_, err := r.ReadString('\n') // qmp_capabilities
			if err == nil {
				fmt.Fprintln(c, `{"return": {}}`)
				_, err = r.ReadString('\n') // the command answered without end
			}
			if err != nil {
				sent <- 0
				return
			}
		}
		chunk := append([]byte(`{"return": "`), bytes.Repeat([]byte("x"), 64<<10)...)
		n := 0
		for n < endlessLine {
			w, err := c.Write(chunk)
			n += w
			if err != nil {
				break
			}
		}
		sent <- n
	}()
	return path, sent
}

// TestQMPEndlessLine: a QEMU that sends a line without end, as its
// greeting or as a command's reply, costs the daemon no more than the
// bound of one line: the read ends with an error that says what
// happened, and the monitor is closed (the fake QEMU's writes fail).
// Before every read was bounded, one such line of 32 MiB made the
// daemon allocate about twice that, and a longer one would have grown
// it until it was killed (issue 43, item 2).
func TestQMPEndlessLine(t *testing.T) {
	for _, c := range []struct {
		name     string
		greeting bool
	}{{"greeting", true}, {"reply", false}} {
		t.Run(c.name, func(t *testing.T) {
			path, sent := hijackedQMP(t, c.greeting)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var err error
			q, err := dialQMP(ctx, path, nil)
			if err == nil {
				_, err = q.run(ctx, "query-status", nil)
				if _, again := q.run(ctx, "query-status", nil); !errors.Is(again, errQMPLineTooLong) {
					t.Errorf("a command after the endless line: %v, want the monitor's end", again)
				}
				q.Close()
			}
			runtime.ReadMemStats(&after)
			if !errors.Is(err, errQMPLineTooLong) || !strings.Contains(err.Error(), "monitor is closed") {
				t.Errorf("err = %v, want the line's bound", err)
			}
			if n := <-sent; n >= endlessLine {
				t.Errorf("the fake QEMU wrote all %d bytes: the monitor was not closed", n)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 1<<20 {
				t.Errorf("allocated %d KiB for one endless line, want at most 1024 KiB (the line's bound is %d KiB)", got>>10, qmpMaxLine>>10)
			}
		})
	}
}

// TestPortEventAfter: the hand-back of an agent connection ends at the
// first event of the agent's port that QEMU stamped after the hang-up and
// that reports the port open: the reopen after a close, or a close and a
// reopen that QEMU folded into one (it does within a second of an earlier
// event). A close alone, an event stamped before, or one of another port
// is not it.
func TestPortEventAfter(t *testing.T) {
	since := time.Unix(1796290515, 500_000_000)
	ev := func(sec, usec int64, id string, open bool) string {
		return fmt.Sprintf(`{"timestamp": {"seconds": %d, "microseconds": %d}, "event": "VSERPORT_CHANGE", "data": {"open": %v, "id": %q}}`, sec, usec, open, id)
	}
	cases := []struct {
		name  string
		lines []string
		want  int // index of the line that ends the wait
	}{
		{"close then reopen", []string{ev(1796290515, 600000, AgentPortID, false), ev(1796290516, 600000, AgentPortID, true)}, 1},
		{"folded into one open", []string{ev(1796290516, 400000, AgentPortID, true)}, 0},
		{"a restore's event first", []string{ev(1796290515, 100000, AgentPortID, true), ev(1796290516, 100000, AgentPortID, true)}, 1},
		{"same microsecond", []string{ev(1796290515, 500000, AgentPortID, true)}, 0},
		{"a close, then a restore's older open", []string{ev(1796290515, 600000, AgentPortID, false), ev(1796290515, 100000, AgentPortID, true), ev(1796290516, 700000, AgentPortID, true)}, 2},
		{"another port", []string{ev(1796290516, 0, "other", false), `{"event": "STOP", "timestamp": {"seconds": 1796290517, "microseconds": 0}}`, ev(1796290517, 0, AgentPortID, true)}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := &qmp{r: bufio.NewReader(strings.NewReader(strings.Join(c.lines, "\n") + "\n"))}
			var ended qmpReply
			err := q.readUntil("VSERPORT_CHANGE", func(r qmpReply) bool {
				ended = r
				return isHandBack(r, since)
			})
			want, _ := parseQMPLine([]byte(c.lines[c.want]))
			if err != nil || ended.stamp() != want.stamp() || string(ended.Data) != string(want.Data) {
				t.Fatalf("ended at %s %s (%v), want line %d", ended.stamp(), ended.Data, err, c.want)
			}
		})
	}
}

// TestWaitEventPassesOthers: a wait for one event gives the others it
// reads past to onEvent, so that a save waiting for its flatten's end
// does not lose the port event that ends its hand-back.
func TestWaitEventPassesOthers(t *testing.T) {
	since := time.Unix(1796290515, 0)
	lines := []string{
		`{"timestamp": {"seconds": 1796290515, "microseconds": 10}, "event": "VSERPORT_CHANGE", "data": {"open": true, "id": "` + AgentPortID + `"}}`,
		`{"return": {}}`,
		`{"timestamp": {"seconds": 1796290515, "microseconds": 20}, "event": "BLOCK_JOB_COMPLETED", "data": {"device": "flatten"}}`,
	}
	q := &qmp{r: bufio.NewReader(strings.NewReader(strings.Join(lines, "\n") + "\n"))}
	handedBack := false
	q.onEvent = func(r qmpReply) {
		if isHandBack(r, since) {
			handedBack = true
		}
	}
	if err := q.readUntil("BLOCK_JOB_COMPLETED", func(qmpReply) bool { return true }); err != nil {
		t.Fatal(err)
	}
	if !handedBack {
		t.Error("the port event read past was lost")
	}
}
