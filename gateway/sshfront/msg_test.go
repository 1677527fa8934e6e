package sshfront

import (
	"testing"

	"golang.org/x/crypto/ssh"
)

// TestWireFormat: the payloads marshal as RFC 4254 lays them out, so the
// agent, the host and OpenSSH agree (pty-req: string, 4 uint32, string).
func TestWireFormat(t *testing.T) {
	b := ssh.Marshal(ptyRequest{Term: "vt", Columns: 80, Rows: 24})
	want := "\x00\x00\x00\x02vt\x00\x00\x00\x50\x00\x00\x00\x18\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"
	if string(b) != want {
		t.Errorf("pty-req %q, want %q", b, want)
	}
	var es exitSignalMsg
	if err := ssh.Unmarshal(ssh.Marshal(exitSignalMsg{Signal: "KILL", CoreDumped: true}), &es); err != nil || es.Signal != "KILL" || !es.CoreDumped {
		t.Errorf("exit-signal round trip: %+v %v", es, err)
	}
}
