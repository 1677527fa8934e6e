package sshmsg

import (
	"testing"

	"golang.org/x/crypto/ssh"
)

func TestBounds(t *testing.T) {
	for _, c := range []struct {
		cols, rows uint32
		ok         bool
	}{{0, 0, true}, {80, 24, true}, {4096, 4096, true}, {4097, 1, false}, {1, 4097, false}} {
		if TermSizeOK(c.cols, c.rows) != c.ok {
			t.Errorf("%dx%d: want %v", c.cols, c.rows, c.ok)
		}
	}
	for term, ok := range map[string]bool{"xterm-256color": true, "": true, "a\nb": false, "a\x00": false, string(make([]byte, 65)): false} {
		if TermNameOK(term) != ok {
			t.Errorf("%q: want %v", term, ok)
		}
	}
}

// TestWireFormat: the payloads marshal as RFC 4254 lays them out, so the
// agent, the host and OpenSSH agree (pty-req: string, 4 uint32, string).
func TestWireFormat(t *testing.T) {
	b := ssh.Marshal(PtyRequest{Term: "vt", Columns: 80, Rows: 24})
	want := "\x00\x00\x00\x02vt\x00\x00\x00\x50\x00\x00\x00\x18\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
	if string(b) != want {
		t.Errorf("pty-req %q, want %q", b, want)
	}
	var es ExitSignalMsg
	if err := ssh.Unmarshal(ssh.Marshal(ExitSignalMsg{Signal: "KILL", CoreDumped: true}), &es); err != nil || es.Signal != "KILL" || !es.CoreDumped {
		t.Errorf("exit-signal round trip: %+v %v", es, err)
	}
}
