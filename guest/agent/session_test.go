package agent

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// frames runs o on a fresh agent through a raw host end and returns, in
// wire order, what the agent sent on its channel: "data" for each output
// frame (counted in stdout and stderr), then the other frame types.
func frames(t *testing.T, o agentproto.Open) (events []string, stdout, stderr int) {
	t.Helper()
	h := startAgent(t, nil).connect(t)
	send := func(ft agentproto.FrameType, p []byte) { h.send(ft, 1, p) }
	send(agentproto.FrameOpen, encode(o))
	send(agentproto.FrameEOF, nil)
	for {
		f := h.read()
		switch f.Type {
		case agentproto.FrameData, agentproto.FrameStderr:
			if f.Type == agentproto.FrameData {
				stdout += len(f.Payload)
			} else {
				stderr += len(f.Payload)
			}
			events = append(events, "data")
			// Grant the window back, as the host does.
			send(agentproto.FrameWindow, agentproto.EncodeUint32(uint32(len(f.Payload))))
		case agentproto.FrameExit:
			e, err := agentproto.DecodeExit(f.Payload)
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, fmt.Sprintf("exit %d%s", e.Status, e.Signal))
		default:
			events = append(events, f.Type.String())
		}
		if f.Type == agentproto.FrameClose {
			send(agentproto.FrameClose, nil)
			return events, stdout, stderr
		}
	}
}

// checkOrder verifies that the answer comes first, that all output
// precedes EOF, which precedes the exit record, which precedes the close.
func checkOrder(t *testing.T, events []string, exit string) {
	t.Helper()
	if len(events) == 0 || events[0] != "open-ok" {
		t.Fatalf("events %v: the answer is not first", events)
	}
	var tail []string
	for i, ev := range events[1:] {
		if ev != "data" {
			tail = events[1+i:]
			break
		}
	}
	if got, want := strings.Join(tail, ","), "eof,"+exit+",close"; got != want {
		t.Errorf("events after the output: %s, want %s", got, want)
	}
}

func TestSessionSendsOutputBeforeExitStatus(t *testing.T) {
	t.Parallel()
	events, stdout, stderr := frames(t, agentproto.Open{Spec: argv("sh", "-c", "head -c 3000000 /dev/zero; echo oops >&2; exit 3")})
	checkOrder(t, events, "exit 3")
	if stdout != 3000000 || stderr != 5 {
		t.Errorf("stdout %d bytes, stderr %d bytes", stdout, stderr)
	}
}

func TestSessionPtySendsOutputBeforeExitStatus(t *testing.T) {
	t.Parallel()
	events, stdout, _ := frames(t, agentproto.Open{Spec: argv("sh", "-c", "stty raw; head -c 100000 /dev/zero; exit 2"),
		PTY: &agentproto.PTY{Term: "dumb", Columns: 80, Rows: 24}})
	checkOrder(t, events, "exit 2")
	if stdout != 100000 {
		t.Errorf("stdout %d bytes", stdout)
	}
}

func TestSessionReportsStartFailure(t *testing.T) {
	t.Parallel()
	events, _, stderr := frames(t, agentproto.Open{Spec: argv("vmgate-no-such-command")})
	checkOrder(t, events, "exit 127")
	if stderr == 0 {
		t.Error("no message on stderr")
	}
}

// TestSessionLeavesItsBackground: what a command leaves running in its
// process group (`cmd &` in a shell) outlives the command's end and the
// channel's close, as it outlives a command of a shell. The agent's
// report closes the channel before it is done with the command; a
// session that then took the close for a client gone away killed the
// group, and with it the background, at random (a hostile-guest test's
// `setsid …&` died before it could leave the group).
func TestSessionLeavesItsBackground(t *testing.T) {
	a := startAgent(t, nil)
	c := a.dial(t)
	var pids []int
	for range 150 {
		// As the host does: the channel closed as soon as the exit
		// record came.
		r := start(t, c, argv("sh", "-c", "sleep 120 </dev/null >/dev/null 2>&1 & echo $!"))
		_ = r.ch.CloseWrite()
		select {
		case <-r.ch.Exited():
		case <-time.After(testTimeout):
			t.Fatal("the command did not end")
		}
		_ = r.ch.Close()
		<-r.done
		pid, err := strconv.Atoi(strings.TrimSpace(r.stdout.String()))
		if err != nil {
			t.Fatalf("%q: %v", r.stdout.String(), err)
		}
		pids = append(pids, pid)
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	}
	// Every session is over once Serve has returned.
	c.Close()
	_ = a.waitServe(t)
	killed := 0
	for _, pid := range pids {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if i := strings.LastIndexByte(string(b), ')'); err != nil || i < 0 || strings.HasPrefix(string(b[i+1:]), " Z") {
			killed++
		}
	}
	if killed > 0 {
		t.Errorf("%d of %d background processes were killed with their command's end", killed, len(pids))
	}
}
