package vm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"
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
	err := q.readUntil("BLOCK_IO_ERROR", func(json.RawMessage) bool { return true })
	if err == nil || !strings.Contains(err.Error(), "longer than 4096") {
		t.Fatalf("waitEvent: %v", err)
	}
}
