package vm

import (
	"context"
	"encoding"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// fakeAnswers is a fake agent's behaviour: call answers an op's call
// (the result, or a refusal); open runs a command (its stdout, its
// stderr, its exit status). A nil call never answers.
type fakeAnswers struct {
	call func(op string, args []byte) (encoding.BinaryMarshaler, string)
	open func(o agentproto.Open) (stdout, stderr []byte, status uint32)
}

// answering is a fake agent that serves calls and commands as a told.
func answering(a fakeAnswers) hostileAgent {
	return func(g *fakeGuest) {
		for {
			f, ok := g.read()
			if !ok {
				return
			}
			switch f.Type {
			case agentproto.FrameCall:
				var c agentproto.Call
				if c.UnmarshalBinary(f.Payload) != nil || a.call == nil {
					continue
				}
				res, refusal := a.call(c.Op, c.Args)
				r := agentproto.Reply{Error: refusal}
				if res != nil {
					r.Result, _ = res.MarshalBinary()
				}
				b, _ := r.MarshalBinary()
				g.send(agentproto.FrameReply, f.ID, b)
			case agentproto.FrameOpen:
				var o agentproto.Open
				if o.UnmarshalBinary(f.Payload) != nil || a.open == nil {
					continue
				}
				stdout, stderr, status := a.open(o)
				g.send(agentproto.FrameOpenOK, f.ID, nil)
				for ft, b := range map[agentproto.FrameType][]byte{agentproto.FrameData: stdout, agentproto.FrameStderr: stderr} {
					for len(b) > 0 {
						n := min(len(b), agentproto.MaxData)
						g.send(ft, f.ID, b[:n])
						b = b[n:]
					}
				}
				g.send(agentproto.FrameEOF, f.ID, nil)
				g.send(agentproto.FrameExit, f.ID, agentproto.EncodeExit(agentproto.Exit{Status: status}))
				g.send(agentproto.FrameClose, f.ID, nil)
			}
		}
	}
}

// replying answers every call with res.
func replying(res encoding.BinaryMarshaler, refusal string) fakeAnswers {
	return fakeAnswers{call: func(string, []byte) (encoding.BinaryMarshaler, string) { return res, refusal }}
}

func running(h int64) agentproto.ProcInfo {
	return agentproto.ProcInfo{Handle: h, PID: 10, Argv: []string{"sleep", "9"}, User: "root", Dir: "/root", State: agentproto.ProcRunning, Started: 1}
}

func TestCheckProcInfo(t *testing.T) {
	exited := running(1)
	exited.State, exited.Exit = agentproto.ProcExited, &agentproto.Exit{Status: 3}
	for name, tc := range map[string]struct {
		edit func(*agentproto.ProcInfo)
		ok   bool
	}{
		"running":            {func(*agentproto.ProcInfo) {}, true},
		"exited":             {func(p *agentproto.ProcInfo) { *p = exited }, true},
		"another handle":     {func(p *agentproto.ProcInfo) { p.Handle = 2 }, false},
		"handle 0":           {func(p *agentproto.ProcInfo) { p.Handle = 0 }, false},
		"unknown state":      {func(p *agentproto.ProcInfo) { p.State = "zombie" }, false},
		"exited without end": {func(p *agentproto.ProcInfo) { p.State = agentproto.ProcExited }, false},
		"running with end":   {func(p *agentproto.ProcInfo) { p.Exit = &agentproto.Exit{} }, false},
		"status and signal": {func(p *agentproto.ProcInfo) {
			*p = exited
			p.Exit = &agentproto.Exit{Status: 1, Signal: "KILL"}
		}, false},
		"more dropped than written": {func(p *agentproto.ProcInfo) { p.Out, p.OutDropped, p.Next = 3, 4, 3 }, false},
		"next off the counts":       {func(p *agentproto.ProcInfo) { p.Out, p.Err, p.Next = 3, 4, 8 }, false},
		"argv past its bound":       {func(p *agentproto.ProcInfo) { p.Argv = []string{strings.Repeat("a", agentproto.MaxInfoArgv)} }, false},
		"negative pid":              {func(p *agentproto.ProcInfo) { p.PID = -1 }, false},
	} {
		pi := running(1)
		tc.edit(&pi)
		if err := checkProcInfo(pi, 1); (err == nil) != tc.ok {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestCheckProcOutput: a ProcOutput whose chunks are out of order,
// overlap, exceed what was asked or disagree with its offsets is refused.
func TestCheckProcOutput(t *testing.T) {
	info := running(1)
	info.Out, info.Err, info.Next = 10, 5, 15
	chunk := func(stream int, off int64, data string) agentproto.OutputChunk {
		return agentproto.OutputChunk{Stream: stream, Offset: off, Data: []byte(data)}
	}
	req := agentproto.ProcLogs{Handle: 1, Since: 2, Max: 100}
	for name, tc := range map[string]struct {
		out agentproto.ProcOutput
		req agentproto.ProcLogs
		ok  bool
	}{
		"in order":           {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 2, "abc"), chunk(2, 5, "de")}, Next: 7}, req, true},
		"with a gap":         {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 2, "abc"), chunk(2, 9, "de")}, Next: 11}, req, true},
		"dropped first":      {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 6, "ab")}, Next: 8, Dropped: 4}, req, true},
		"nothing new":        {agentproto.ProcOutput{Next: 15, Dropped: 13}, req, true},
		"a wait":             {agentproto.ProcOutput{Next: 2}, agentproto.ProcLogs{Handle: 1, Since: 2}, true},
		"out of order":       {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 2, "abc"), chunk(2, 3, "de")}, Next: 5}, req, false},
		"backwards":          {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 6, "a"), chunk(2, 2, "b")}, Next: 3, Dropped: 4}, req, false},
		"not at since":       {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 3, "a")}, Next: 4}, req, false},
		"more than asked":    {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 2, "abc")}, Next: 5}, agentproto.ProcLogs{Handle: 1, Since: 2, Max: 2}, false},
		"output on a wait":   {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 2, "a")}, Next: 3}, agentproto.ProcLogs{Handle: 1, Since: 2}, false},
		"an empty chunk":     {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 2, "")}, Next: 2}, req, false},
		"a third stream":     {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(3, 2, "a")}, Next: 3}, req, false},
		"next off its end":   {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 2, "a")}, Next: 4}, req, false},
		"next past output":   {agentproto.ProcOutput{Next: 16, Dropped: 14}, req, false},
		"negative dropped":   {agentproto.ProcOutput{Next: 1, Dropped: -1}, req, false},
		"another's info":     {agentproto.ProcOutput{Next: 2}, agentproto.ProcLogs{Handle: 2, Since: 2}, false},
		"too many chunks":    {agentproto.ProcOutput{Chunks: make([]agentproto.OutputChunk, agentproto.MaxLogsChunks+1)}, req, false},
		"past the max chunk": {agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{chunk(1, 2, strings.Repeat("a", agentproto.MaxLogsChunk+1))}, Next: 2 + agentproto.MaxLogsChunk + 1}, agentproto.ProcLogs{Handle: 1, Since: 2, Max: 1 << 30}, false},
	} {
		out := tc.out
		out.Info = info
		if name == "past the max chunk" {
			out.Info.Out, out.Info.Next = 1<<20, 1<<20+5
		}
		if err := checkProcOutput(out, tc.req); (err == nil) != tc.ok {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestCheckProcPage(t *testing.T) {
	page := func(more bool, handles ...int64) agentproto.ProcList {
		l := agentproto.ProcList{More: more}
		for _, h := range handles {
			l.Procs = append(l.Procs, running(h))
		}
		return l
	}
	for name, tc := range map[string]struct {
		l     agentproto.ProcList
		after int64
		seen  int
		ok    bool
	}{
		"first page":           {page(true, 1, 2, 5), 0, 0, true},
		"next page":            {page(false, 6), 5, 3, true},
		"empty":                {page(false), 0, 0, true},
		"again from the start": {page(true, 1, 2), 5, 3, false},
		"not increasing":       {page(false, 3, 3), 0, 0, false},
		"empty with more":      {page(true), 0, 0, false},
		"too many in all":      {page(false, 9999), 0, maxListed, false},
	} {
		if err := checkProcPage(tc.l, tc.after, tc.seen); (err == nil) != tc.ok {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestProcCallsFakeAgent: the typed calls through a fake agent: its
// refusals map to the package's errors, a reply that breaks the contract
// is ErrBadReply, and a list that never ends is refused.
func TestProcCallsFakeAgent(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		answers fakeAnswers
		call    func(v *VM) error
		want    error
	}{
		"start": {replying(running(7), ""), func(v *VM) error {
			pi, err := v.ProcStart(ctx, agentproto.ProcStart{Spec: agentproto.ExecSpec{Argv: []string{"sleep", "9"}}})
			if err == nil && pi.Handle != 7 {
				return errors.New("another handle")
			}
			return err
		}, nil},
		"start past the limit": {replying(nil, "limit: 32 processes run, at most 32"), func(v *VM) error {
			_, err := v.ProcStart(ctx, agentproto.ProcStart{Spec: agentproto.ExecSpec{Argv: []string{"true"}}})
			return err
		}, ErrProcLimit},
		"a start's bad reply": {replying(agentproto.ProcInfo{Handle: 7, State: "?"}, ""), func(v *VM) error {
			_, err := v.ProcStart(ctx, agentproto.ProcStart{Spec: agentproto.ExecSpec{Argv: []string{"true"}}})
			return err
		}, ErrBadReply},
		"logs of a forgotten handle": {replying(nil, "no-handle: no process has handle 3"), func(v *VM) error {
			_, err := v.ProcLogs(ctx, agentproto.ProcLogs{Handle: 3, Max: 10})
			return err
		}, ErrNoProcess},
		"logs out of order": {replying(agentproto.ProcOutput{Chunks: []agentproto.OutputChunk{{Stream: 1, Offset: 5, Data: []byte("x")}, {Stream: 1, Offset: 1, Data: []byte("y")}}, Next: 2, Info: running(3)}, ""), func(v *VM) error {
			_, err := v.ProcLogs(ctx, agentproto.ProcLogs{Handle: 3, Max: 10})
			return err
		}, ErrBadReply},
		"input not read": {replying(nil, "busy: it has not read 1048576 bytes of its input"), func(v *VM) error {
			return v.ProcInput(ctx, 3, []byte("x"), false)
		}, ErrProcBusy},
		"signal to an ended process": {replying(nil, "ended: process 3 has ended"), func(v *VM) error {
			return v.ProcSignal(ctx, 3, "TERM")
		}, ErrProcEnded},
		"a list without end": {replying(agentproto.ProcList{Procs: []agentproto.ProcInfo{running(1)}, More: true}, ""), func(v *VM) error {
			_, err := v.ProcList(ctx)
			return err
		}, ErrBadReply},
		"an older agent": {replying(nil, `unknown call "proc.list"`), func(v *VM) error {
			_, err := v.ProcList(ctx)
			if err == nil || !strings.Contains(err.Error(), "unknown call") {
				return errors.New("not the agent's refusal")
			}
			return nil
		}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			v := fakeVM(t, answering(tc.answers))
			if err := tc.call(v); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
}

// TestProcLogsCallerGivesUp: a caller that stops waiting for a long poll
// gets its answer at once, and the VM lives on; an agent that does not
// answer within the call's limit loses it.
func TestProcLogsCallerGivesUp(t *testing.T) {
	v := fakeVM(t, answering(fakeAnswers{})) // never answers a call
	v.control = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err := v.ProcLogs(ctx, agentproto.ProcLogs{Handle: 1, Max: 10, WaitMS: 1000})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(t0) > time.Second {
		t.Fatalf("after %v: %v", time.Since(t0), err)
	}
	select {
	case <-v.exited:
		t.Fatal("the caller's giving up killed the VM")
	case <-time.After(500 * time.Millisecond):
	}
	// The call's own limit (wait + control) passes: the agent is given
	// up, with its VM.
	select {
	case <-v.exited:
	case <-time.After(3 * time.Second):
		t.Fatal("an agent that never answered kept its VM")
	}
}

func TestProcHostChecks(t *testing.T) {
	v := fakeVM(t, answering(fakeAnswers{}))
	ctx := context.Background()
	if _, err := v.ProcStart(ctx, agentproto.ProcStart{}); err == nil {
		t.Error("an empty argv went to the guest")
	}
	if _, err := v.ProcStart(ctx, agentproto.ProcStart{Spec: agentproto.ExecSpec{Argv: []string{"a\x00"}}}); err == nil {
		t.Error("a NUL byte went to the guest")
	}
	if err := v.ProcSignal(ctx, 1, "NOPE"); err == nil {
		t.Error("an unknown signal went to the guest")
	}
	if err := v.ProcInput(ctx, 1, make([]byte, agentproto.MaxInputChunk+1), false); err == nil {
		t.Error("too much input went to the guest")
	}
	if _, err := v.ProcLogs(ctx, agentproto.ProcLogs{Handle: 1, WaitMS: agentproto.MaxLogsWait + 1}); err == nil {
		t.Error("a wait past its bound went to the guest")
	}
}
