package agent

import (
	"errors"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
)

// procAgent starts an agent with a table of its own (killed at the end of
// the test) and returns the table and a connected host.
func procAgent(t *testing.T) (*procTable, *agentconn.Conn) {
	t.Helper()
	tbl := newTestTable(t)
	return tbl, startAgent(t, func(c *Config) { c.procs = tbl }).dial(t)
}

func newTestTable(t *testing.T) *procTable {
	t.Helper()
	tbl := newProcTable(testLogger(t))
	t.Cleanup(func() { tbl.close(testTimeout) })
	return tbl
}

// procStart starts a background process; the agent must take it.
func procStart(t *testing.T, c *agentconn.Conn, req agentproto.ProcStart) agentproto.ProcInfo {
	t.Helper()
	var pi agentproto.ProcInfo
	if err := c.Call(t.Context(), agentproto.CallProcStart, req, &pi); err != nil {
		t.Fatalf("start %v: %v", req.Spec.Argv, err)
	}
	return pi
}

// bg is a ProcStart of argv.
func bg(argv ...string) agentproto.ProcStart {
	return agentproto.ProcStart{Spec: agentproto.ExecSpec{Argv: argv}}
}

// logs asks for a process's output.
func logs(t *testing.T, c *agentconn.Conn, req agentproto.ProcLogs) agentproto.ProcOutput {
	t.Helper()
	var out agentproto.ProcOutput
	if err := c.Call(t.Context(), agentproto.CallProcLogs, req, &out); err != nil {
		t.Fatalf("logs %+v: %v", req, err)
	}
	return out
}

// waitEnd waits for a process's end (a logs call without output).
func waitEnd(t *testing.T, c *agentconn.Conn, h int64) agentproto.ProcInfo {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		out := logs(t, c, agentproto.ProcLogs{Handle: h, WaitMS: agentproto.MaxLogsWait})
		if out.Info.State == agentproto.ProcExited {
			return out.Info
		}
	}
	t.Fatalf("process %d did not end", h)
	return agentproto.ProcInfo{}
}

// output reads a process's whole output until its end, following it as
// a host does, and returns each stream and the process's end.
func output(t *testing.T, c *agentconn.Conn, h int64) (stdout, stderr string, info agentproto.ProcInfo) {
	t.Helper()
	var so, se strings.Builder
	var since int64
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		out := logs(t, c, agentproto.ProcLogs{Handle: h, Since: since, Max: agentproto.MaxLogsChunk, WaitMS: agentproto.MaxLogsWait})
		for _, ch := range out.Chunks {
			if ch.Stream == agentproto.StreamStdout {
				so.Write(ch.Data)
			} else {
				se.Write(ch.Data)
			}
		}
		since = out.Next
		if out.Info.State == agentproto.ProcExited && since == out.Info.Next {
			return so.String(), se.String(), out.Info
		}
	}
	t.Fatalf("process %d did not end", h)
	return "", "", agentproto.ProcInfo{}
}

// refusalCode calls op and returns the code of the agent's refusal.
func refusalCode(t *testing.T, c *agentconn.Conn, op string, args encodingMarshaler) string {
	t.Helper()
	err := c.Call(t.Context(), op, args, nil)
	var ce *agentconn.CallError
	if !errors.As(err, &ce) {
		t.Fatalf("%s %+v: %v, want a refusal", op, args, err)
	}
	code, _ := agentproto.ProcErrorCode(ce.Msg)
	if code == "" {
		t.Fatalf("%s: refusal %q has no code", op, ce.Msg)
	}
	return code
}

type encodingMarshaler interface{ MarshalBinary() ([]byte, error) }

func TestProcStartAndLogs(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	before := time.Now()
	pi := procStart(t, c, bg("sh", "-c", "echo out; echo err >&2; exit 3"))
	if pi.Handle != 1 || pi.PID <= 0 || pi.State != agentproto.ProcRunning || pi.User != "root" || pi.Argv[0] != "sh" || pi.Started < before.UnixNano() {
		t.Fatalf("start: %+v", pi)
	}
	info := waitEnd(t, c, pi.Handle)
	if info.Exit == nil || info.Exit.Status != 3 || info.TimedOut || info.Ended < info.Started || info.Out != 4 || info.Err != 4 || info.Next != 8 {
		t.Fatalf("end: %+v", info)
	}
	out := logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Max: 100})
	if len(out.Chunks) != 2 || out.Next != 8 || out.Dropped != 0 {
		t.Fatalf("logs: %+v", out)
	}
	// Written at once, the two streams' order is the order the agent
	// read its two pipes in (TestProcOffsetsAcrossStreams spaces them).
	for _, ch := range out.Chunks {
		want := map[int]string{agentproto.StreamStdout: "out\n", agentproto.StreamStderr: "err\n"}[ch.Stream]
		if string(ch.Data) != want || (ch.Offset != 0 && ch.Offset != 4) {
			t.Errorf("chunk %+v, want %q at 0 or 4", ch, want)
		}
	}
	if out.Chunks[0].Stream == out.Chunks[1].Stream {
		t.Errorf("chunks of one stream: %+v", out.Chunks)
	}
	// Max 0 carries no output.
	if out := logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Since: 2}); len(out.Chunks) != 0 || out.Next != 2 || out.Dropped != 0 {
		t.Fatalf("logs without output: %+v", out)
	}
	// Past the end: refused.
	if code := refusalCode(t, c, agentproto.CallProcLogs, agentproto.ProcLogs{Handle: pi.Handle, Since: 9, Max: 1}); code != agentproto.ProcErrInvalid {
		t.Errorf("since past the end: %s", code)
	}
}

// TestProcOffsetsAcrossStreams: offsets count both streams in the order
// written.
func TestProcOffsetsAcrossStreams(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	pi := procStart(t, c, bg("sh", "-c", "printf a; sleep 0.1; printf bb >&2; sleep 0.1; printf c"))
	waitEnd(t, c, pi.Handle)
	out := logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Max: 100})
	want := []agentproto.OutputChunk{{Stream: 1, Offset: 0, Data: []byte("a")}, {Stream: 2, Offset: 1, Data: []byte("bb")}, {Stream: 1, Offset: 3, Data: []byte("c")}}
	if !equalChunks(out.Chunks, want) || out.Next != 4 {
		t.Fatalf("chunks %+v next %d, want %+v", out.Chunks, out.Next, want)
	}
	// From an offset inside the output.
	out = logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Since: 2, Max: 100})
	if want := want[1:]; len(out.Chunks) != 2 || out.Chunks[0].Offset != 2 || string(out.Chunks[0].Data) != "b" || !equalChunks(out.Chunks[1:], want[1:]) {
		t.Fatalf("from 2: %+v", out.Chunks)
	}
}

// TestProcLongPoll: a logs call with WaitMS answers as soon as output
// comes, or the process ends, not at the end of its wait; without either
// it answers at the end of its wait.
func TestProcLongPoll(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	pi := procStart(t, c, bg("sh", "-c", "sleep 0.3; echo late; sleep 0.3"))
	t0 := time.Now()
	out := logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Max: 100, WaitMS: 20_000})
	if took := time.Since(t0); took > 10*time.Second || len(out.Chunks) != 1 || string(out.Chunks[0].Data) != "late\n" {
		t.Fatalf("after %v: %+v", took, out)
	}
	if out.Info.State != agentproto.ProcRunning {
		t.Fatalf("the process ended already: %+v", out.Info)
	}
	// A wait for the end alone (Max 0).
	out = logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Since: out.Next, WaitMS: 20_000})
	if took := time.Since(t0); took > 10*time.Second || out.Info.State != agentproto.ProcExited || len(out.Chunks) != 0 {
		t.Fatalf("after %v: %+v", took, out)
	}

	pi = procStart(t, c, bg("sleep", "30"))
	t0 = time.Now()
	out = logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Max: 100, WaitMS: 300})
	if took := time.Since(t0); took < 250*time.Millisecond || out.Info.State != agentproto.ProcRunning || len(out.Chunks) != 0 || out.Next != 0 {
		t.Fatalf("a wait without output ended after %v: %+v", took, out)
	}
}

func TestProcInput(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	req := bg("sh", "-c", "read a; echo got $a; cat")
	req.Stdin = true
	pi := procStart(t, c, req)
	if !pi.StdinOpen {
		t.Fatalf("start: %+v", pi)
	}
	for _, in := range []agentproto.ProcInput{{Handle: pi.Handle, Data: []byte("one\n")}, {Handle: pi.Handle, Data: []byte("two\n"), EOF: true}} {
		if err := c.Call(t.Context(), agentproto.CallProcInput, in, nil); err != nil {
			t.Fatalf("input %q: %v", in.Data, err)
		}
	}
	stdout, _, info := output(t, c, pi.Handle)
	if stdout != "got one\ntwo\n" || info.Exit == nil || info.Exit.Status != 0 || info.StdinOpen {
		t.Fatalf("stdout %q, %+v", stdout, info)
	}
	// Its input is closed; a process without one has none.
	if code := refusalCode(t, c, agentproto.CallProcInput, agentproto.ProcInput{Handle: pi.Handle, Data: []byte("x")}); code != agentproto.ProcErrEnded {
		t.Errorf("input after EOF: %s", code)
	}
	other := procStart(t, c, bg("sleep", "30"))
	if code := refusalCode(t, c, agentproto.CallProcInput, agentproto.ProcInput{Handle: other.Handle, Data: []byte("x")}); code != agentproto.ProcErrEnded || other.StdinOpen {
		t.Errorf("input to a process without one: %s (%+v)", code, other)
	}
	if code := refusalCode(t, c, agentproto.CallProcInput, agentproto.ProcInput{Handle: other.Handle, Data: make([]byte, agentproto.MaxInputChunk+1)}); code != agentproto.ProcErrInvalid {
		t.Errorf("too much input: %s", code)
	}
}

// TestProcInputNotRead: a process that does not read its input fills
// the queue; the next input waits, then is refused, and the call never
// hangs.
func TestProcInputNotRead(t *testing.T) {
	t.Parallel()
	tbl, c := procAgent(t)
	req := bg("sleep", "30")
	req.Stdin = true
	pi := procStart(t, c, req)
	chunk := make([]byte, agentproto.MaxInputChunk)
	// The pipe takes 64 KiB, the queue the rest.
	if err := c.Call(t.Context(), agentproto.CallProcInput, agentproto.ProcInput{Handle: pi.Handle, Data: chunk}, nil); err != nil {
		t.Fatal(err)
	}
	p, _ := tbl.get(pi.Handle)
	t0 := time.Now()
	if err := p.stdin.put(chunk, false, 200*time.Millisecond); err == nil || !strings.HasPrefix(err.Error(), agentproto.ProcErrBusy+": ") {
		t.Fatalf("input past the queue: %v", err)
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Fatalf("the refusal took %v", took)
	}
}

func TestProcSignal(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	pi := procStart(t, c, bg("sleep", "30"))
	if err := c.Call(t.Context(), agentproto.CallProcSignal, agentproto.ProcSignal{Handle: pi.Handle, Signal: "TERM"}, nil); err != nil {
		t.Fatal(err)
	}
	info := waitEnd(t, c, pi.Handle)
	if info.Exit == nil || info.Exit.Signal != "TERM" || info.TimedOut {
		t.Fatalf("after TERM: %+v", info)
	}
	if code := refusalCode(t, c, agentproto.CallProcSignal, agentproto.ProcSignal{Handle: pi.Handle, Signal: "TERM"}); code != agentproto.ProcErrEnded {
		t.Errorf("a signal to an ended process: %s", code)
	}
	if code := refusalCode(t, c, agentproto.CallProcSignal, agentproto.ProcSignal{Handle: pi.Handle, Signal: "NOPE"}); code != agentproto.ProcErrInvalid {
		t.Errorf("an unknown signal: %s", code)
	}
}

// TestProcTimeout: at its time limit a process is killed with the rest
// of its session, a child in a process group of its own included.
func TestProcTimeout(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("perl"); err != nil {
		t.Skip("no perl to make a process group")
	}
	_, c := procAgent(t)
	req := bg("sh", "-c", `perl -e 'setpgrp(0, 0); sleep 30' & echo $!; wait`)
	req.TimeoutMS = 500
	pi := procStart(t, c, req)
	stdout, _, info := output(t, c, pi.Handle)
	if info.Exit == nil || info.Exit.Signal != "KILL" || !info.TimedOut {
		t.Fatalf("after its time limit: %+v", info)
	}
	child, err := strconv.Atoi(strings.TrimSpace(stdout))
	if err != nil {
		t.Fatalf("child pid %q: %v", stdout, err)
	}
	waitGone(t, child)
}

// TestProcExitStatusWithStraggler: a process whose child outlives it,
// holding its output open, still has its own exit status, and the child
// runs on.
func TestProcExitStatusWithStraggler(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	pi := procStart(t, c, bg("sh", "-c", "sleep 30 & echo $!; exit 5"))
	stdout, _, info := output(t, c, pi.Handle)
	child, err := strconv.Atoi(strings.TrimSpace(stdout))
	if err != nil {
		t.Fatalf("child pid %q: %v", stdout, err)
	}
	defer syscall.Kill(child, syscall.SIGKILL)
	if info.Exit == nil || info.Exit.Status != 5 {
		t.Fatalf("end: %+v", info)
	}
	if processGone(child) {
		t.Error("the child died with its parent")
	}
}

// TestProcBufferBounded: a process that writes without end keeps the
// agent's memory bounded: its buffer stays at its bound, and the dropped
// count grows.
func TestProcBufferBounded(t *testing.T) {
	t.Parallel()
	tbl, c := procAgent(t)
	const bound = 64 << 10
	req := bg("yes", "vmgate")
	req.BufferBytes = bound
	pi := procStart(t, c, req)
	p, _ := tbl.get(pi.Handle)
	var out agentproto.ProcOutput
	deadline := time.Now().Add(testTimeout)
	for {
		out = logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Since: 0, Max: agentproto.MaxLogsChunk})
		if out.Info.Out > 64*bound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("yes wrote only %d bytes", out.Info.Out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.mu.Lock()
	s := p.out.streams[0]
	held, capacity, runs := s.ring.n, len(s.ring.buf), len(s.runs)
	p.mu.Unlock()
	if held > bound || capacity > bound || runs > maxRuns(bound) {
		t.Errorf("stdout holds %d bytes in %d (bound %d), %d runs", held, capacity, bound, runs)
	}
	if out.Info.OutDropped < out.Info.Out-bound || out.Dropped == 0 || out.Chunks[0].Offset != out.Dropped {
		t.Errorf("dropped %d of %d; the read from 0: dropped %d, first chunk at %d", out.Info.OutDropped, out.Info.Out, out.Dropped, out.Chunks[0].Offset)
	}
	var later agentproto.ProcOutput
	for {
		later = logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Max: 1})
		if later.Info.OutDropped > out.Info.OutDropped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dropped count did not grow: %d, then %d", out.Info.OutDropped, later.Info.OutDropped)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Offsets a reader holds go on: what follows its offset is still
	// what yes writes.
	next := logs(t, c, agentproto.ProcLogs{Handle: pi.Handle, Since: later.Info.Next - 7, Max: 7})
	if len(next.Chunks) != 1 || len(next.Chunks[0].Data) != 7 || !strings.Contains("vmgate\nvmgate\n", string(next.Chunks[0].Data)) {
		t.Errorf("the last 7 bytes: %+v", next.Chunks)
	}
	if err := c.Call(t.Context(), agentproto.CallProcSignal, agentproto.ProcSignal{Handle: pi.Handle, Signal: "KILL"}, nil); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, c, pi.Handle)
}

// TestProcOutlivesConnection: a background process runs on after the
// connection that started it ends, and the next connection finds it by
// its handle; a command of that connection dies with it.
func TestProcOutlivesConnection(t *testing.T) {
	t.Parallel()
	tbl := newTestTable(t)
	first := startAgent(t, func(c *Config) { c.procs = tbl })
	c1 := first.dial(t)
	pi := procStart(t, c1, bg("sh", "-c", "sleep 0.5; echo done"))
	fg := start(t, c1, argv("sh", "-c", "echo $$; exec sleep 100"))
	fgPID := waitPID(t, fg)
	c1.Close()
	first.conn.Close()
	_ = first.waitServe(t)
	waitGone(t, fgPID)

	c2 := startAgent(t, func(c *Config) { c.procs = tbl }).dial(t)
	var list agentproto.ProcList
	if err := c2.Call(t.Context(), agentproto.CallProcList, agentproto.ProcListQuery{}, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Procs) != 1 || list.Procs[0].Handle != pi.Handle || list.More {
		t.Fatalf("the next connection's list: %+v", list)
	}
	stdout, _, info := output(t, c2, pi.Handle)
	if stdout != "done\n" || info.Exit == nil || info.Exit.Status != 0 {
		t.Fatalf("stdout %q, %+v", stdout, info)
	}
}

// TestProcMaxProcs: past its MaxProcs running processes a start is
// refused; once one ends, the next is taken.
func TestProcMaxProcs(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	req := bg("sleep", "30")
	req.MaxProcs = 2
	a := procStart(t, c, req)
	procStart(t, c, req)
	if code := refusalCode(t, c, agentproto.CallProcStart, req); code != agentproto.ProcErrLimit {
		t.Fatalf("a third: %s", code)
	}
	if err := c.Call(t.Context(), agentproto.CallProcSignal, agentproto.ProcSignal{Handle: a.Handle, Signal: "KILL"}, nil); err != nil {
		t.Fatal(err)
	}
	waitEnd(t, c, a.Handle)
	if pi := procStart(t, c, req); pi.Handle != 3 { // a refusal takes no handle
		t.Fatalf("the next start: %+v", pi)
	}
}

// TestProcUnknownHandle: a handle the table never gave is refused.
func TestProcUnknownHandle(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	for op, args := range map[string]encodingMarshaler{
		agentproto.CallProcLogs:   agentproto.ProcLogs{Handle: 99, Max: 10},
		agentproto.CallProcInput:  agentproto.ProcInput{Handle: 99, Data: []byte("x")},
		agentproto.CallProcSignal: agentproto.ProcSignal{Handle: 99, Signal: "TERM"},
	} {
		if code := refusalCode(t, c, op, args); code != agentproto.ProcErrNoHandle {
			t.Errorf("%s of handle 99: %s", op, code)
		}
	}
}

// TestProcStartFailures: a process that cannot start is taken and ends
// as a command would; a malformed start is refused.
func TestProcStartFailures(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	for _, tc := range []struct {
		spec   agentproto.ExecSpec
		status uint32
		stderr string
	}{
		{agentproto.ExecSpec{Argv: []string{"vmgate-no-such-command"}}, 127, "vmgate-agent: vmgate-no-such-command: command not found\n"},
		{agentproto.ExecSpec{Argv: []string{"true"}, User: "vmgate-no-such-user"}, 126, "vmgate-agent: user \"vmgate-no-such-user\": no such account in this guest\n"},
		{agentproto.ExecSpec{Argv: []string{"true"}, Dir: "/nonexistent"}, 126, "vmgate-agent: cd /nonexistent: no such file or directory\n"},
	} {
		pi := procStart(t, c, agentproto.ProcStart{Spec: tc.spec})
		if pi.State != agentproto.ProcExited || pi.Exit == nil || pi.Exit.Status != tc.status {
			t.Errorf("%+v: %+v", tc.spec, pi)
		}
		if _, stderr, _ := output(t, c, pi.Handle); stderr != tc.stderr {
			t.Errorf("%+v: stderr %q, want %q", tc.spec, stderr, tc.stderr)
		}
	}
	for _, req := range []agentproto.ProcStart{
		{},
		{Spec: agentproto.ExecSpec{Argv: []string{"true"}}, BufferBytes: agentproto.MaxProcBuffer + 1},
		{Spec: agentproto.ExecSpec{Argv: []string{"true"}}, TimeoutMS: -1},
		{Spec: agentproto.ExecSpec{Argv: []string{"true"}, Dir: "/" + strings.Repeat("d", agentproto.MaxProcDir)}},
	} {
		if code := refusalCode(t, c, agentproto.CallProcStart, req); code != agentproto.ProcErrInvalid {
			t.Errorf("%+v: %s", req, code)
		}
	}
	if err := c.Call(t.Context(), agentproto.CallProcStart, wire("short"), nil); err == nil {
		t.Error("a malformed payload was taken")
	}
}

// TestProcListPages: a list that does not fit one reply comes in pages,
// oldest first; a long command line is cut.
func TestProcListPages(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	long := strings.Repeat("x", 3000)
	const n = 60
	for range n {
		procStart(t, c, bg("true", long))
	}
	var all []agentproto.ProcInfo
	var q agentproto.ProcListQuery
	pages := 0
	for {
		var l agentproto.ProcList
		if err := c.Call(t.Context(), agentproto.CallProcList, q, &l); err != nil {
			t.Fatal(err)
		}
		pages++
		all = append(all, l.Procs...)
		if !l.More {
			break
		}
		q.After = l.Procs[len(l.Procs)-1].Handle
	}
	if len(all) != n || pages < 2 {
		t.Fatalf("%d processes in %d pages", len(all), pages)
	}
	for i, pi := range all {
		if pi.Handle != int64(i+1) || !pi.ArgvCut || len(pi.Argv) != 2 || len(pi.Argv[1]) != agentproto.MaxInfoArgv-(4+len("true"))-4 {
			t.Fatalf("process %d: handle %d, argv cut %v, %d strings", i, pi.Handle, pi.ArgvCut, len(pi.Argv))
		}
	}
}

// TestProcTableForgets: the table keeps twice its MaxProcs ended
// processes, and forgets the oldest past that.
func TestProcTableForgets(t *testing.T) {
	t.Parallel()
	_, c := procAgent(t)
	req := bg("true")
	req.MaxProcs = 1
	for range 4 {
		waitEnd(t, c, procStart(t, c, req).Handle)
	}
	var l agentproto.ProcList
	if err := c.Call(t.Context(), agentproto.CallProcList, agentproto.ProcListQuery{}, &l); err != nil {
		t.Fatal(err)
	}
	if len(l.Procs) != 2 || l.Procs[0].Handle != 3 || l.Procs[1].Handle != 4 {
		t.Fatalf("kept %+v", l.Procs)
	}
	if code := refusalCode(t, c, agentproto.CallProcLogs, agentproto.ProcLogs{Handle: 1, Max: 1}); code != agentproto.ProcErrNoHandle {
		t.Errorf("a forgotten handle: %s", code)
	}
}

// TestProcUser: a background process runs as the user its spec names.
func TestProcUser(t *testing.T) {
	t.Parallel()
	u, err := user.Lookup("nobody")
	if err != nil || os.Geteuid() != 0 {
		t.Skip("needs root and a nobody account")
	}
	_, c := procAgent(t)
	pi := procStart(t, c, agentproto.ProcStart{Spec: agentproto.ExecSpec{Argv: []string{"id", "-u"}, User: "nobody", Dir: "/"}})
	stdout, _, info := output(t, c, pi.Handle)
	if stdout != u.Uid+"\n" || info.User != "nobody" || info.Dir != "/" {
		t.Fatalf("stdout %q, %+v", stdout, info)
	}
}

// TestProcTableClose: closing the table kills what runs and refuses
// what comes.
func TestProcTableClose(t *testing.T) {
	t.Parallel()
	tbl, c := procAgent(t)
	pi := procStart(t, c, bg("sleep", "30"))
	tbl.close(testTimeout)
	info := waitEnd(t, c, pi.Handle)
	if info.Exit == nil || info.Exit.Signal != "KILL" {
		t.Fatalf("after close: %+v", info)
	}
	if code := refusalCode(t, c, agentproto.CallProcStart, bg("true")); code != agentproto.ProcErrLimit {
		t.Errorf("a start after close: %s", code)
	}
}

func TestCutArgv(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		max  int
		want []string
		cut  bool
	}{
		{[]string{"ab", "cd"}, 12, []string{"ab", "cd"}, false},
		{[]string{"ab", "cdef"}, 12, []string{"ab", "cd"}, true},
		{[]string{"ab", "cd"}, 9, []string{"ab"}, true},
		{nil, 10, nil, false},
	} {
		got, cut := cutArgv(tc.argv, tc.max)
		if strings.Join(got, ",") != strings.Join(tc.want, ",") || cut != tc.cut {
			t.Errorf("cutArgv(%q, %d) = %q, %v; want %q, %v", tc.argv, tc.max, got, cut, tc.want, tc.cut)
		}
	}
}
