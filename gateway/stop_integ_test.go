package gateway_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

const stopTestPolicy = `version = 1
[[profile]]
name = "test"
match = { any = true }
allow_shell = true
max_vms = 3
[profile.sessions]
allowed = true
`

// TestGateway_StopWithLingeringSocket: a caller with a session passes, as
// a published port's listening socket, a TCP socket whose close would
// wait out its linger time (30 s, data its peer does not take). The
// daemon refuses it at once, and a stop then pauses every session within
// its grace period and 5 s: nothing is lost. (Before, the refusal's close
// waited, the request never ended, the stop waited on it past any grace,
// and under systemd every running session was lost.)
func TestGateway_StopWithLingeringSocket(t *testing.T) {
	const grace = 5 * time.Second
	d := gatewaytest.Start(t, stopTestPolicy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 0, testutil.TemplateDir(t)
		c.Grace = grace
	})
	for _, s := range []string{"a", "b"} {
		if res, so, se := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo kept > /tmp/x"}, Shell: true, Session: s}, nil); res.ExitCode != 0 {
			t.Fatalf("session %s: %+v %q %q", s, res, so, se)
		}
	}

	conn, err := net.Dial("unix", d.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"guest_port":8000}`
	fmt.Fprintf(conn, "POST /v1/sessions/a/publish HTTP/1.1\r\nHost: vmgate\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		wire.PublishUpgrade, len(body), body)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("publish upgrade: %v %v", resp, err)
	}
	fd := testutil.LingeringSocket(t)
	if _, _, err := conn.(*net.UnixConn).WriteMsgUnix([]byte{0}, unix.UnixRights(fd), nil); err != nil {
		t.Fatal(err)
	}
	// The daemon's copy is to be the socket's last: this one goes now
	// (off this goroutine, should the daemon have been quicker).
	go unix.Close(fd)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, p, err := wire.ReadFrame(br)
	if err != nil || typ != wire.FrameError || !strings.Contains(string(p), "not a listening stream socket") {
		t.Fatalf("the daemon's answer to a socket that is not listening: %q %s %v", typ, p, err)
	}

	t0 := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- d.Stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("stop: %v", err)
		}
	case <-time.After(grace + 40*time.Second):
		t.Fatal("the daemon did not stop")
	}
	if took := time.Since(t0); took > grace+5*time.Second {
		t.Errorf("the stop took %v, more than the grace period (%v) and 5 s", took, grace)
	}
	for _, s := range []string{"a", "b"} {
		var rec struct{ State string }
		b, err := os.ReadFile(filepath.Join(sessionDirOf(t, d.Config.VM.StateDir, s), "session.json"))
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil || rec.State != wire.SessionPaused {
			t.Errorf("session %s after the stop: %q %v", s, rec.State, err)
		}
	}
}
