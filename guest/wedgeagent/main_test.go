package main

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentconn"
	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

// TestWedge plays the host's side of the protocol (agentconn's) against
// wedge, taking over a connection in its middle: an agent answered the
// hello and accepted a command, then wedge takes its end. The host takes
// every frame it sends: the takeover status as that command's exit (and
// the frames for other ids dropped), an info answer, the next command
// accepted with its output, and that command's exit while the host's
// stdin write to it is stuck, which then ends at the write deadline.
func TestWedge(t *testing.T) {
	hostEnd, guestEnd := testutil.SocketPair(t)
	defer guestEnd.Close()
	host := agentconn.Client(hostEnd, nil)
	defer host.Close()
	host.SetWriteTimeout(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The agent before the takeover: the hello, then the first command.
	agentDone := make(chan error, 1)
	go func() {
		var buf []byte
		for {
			f, err := agentproto.ReadFrame(guestEnd, &buf, agentproto.MaxHostPayload)
			if err != nil {
				agentDone <- err
				return
			}
			var reply []byte
			switch f.Type {
			case agentproto.FrameHello:
				p, _ := agentproto.HelloReply{Protocol: agentproto.Protocol, AgentVersion: "real"}.MarshalBinary()
				reply = agentproto.AppendFrame(nil, agentproto.FrameHello, 0, p)
			case agentproto.FrameOpen:
				reply = agentproto.AppendFrame(nil, agentproto.FrameOpenOK, f.ID, nil)
			default:
				agentDone <- errors.New("unexpected " + f.Type.String())
				return
			}
			if _, err := guestEnd.Write(reply); err != nil || f.Type == agentproto.FrameOpen {
				agentDone <- err
				return
			}
		}
	}()
	first, err := host.Open(ctx, agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"/tmp/wedgeagent"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-agentDone; err != nil {
		t.Fatal(err)
	}
	_ = first.CloseWrite() // its stdin's EOF: for the agent, read by wedge

	wedged := make(chan error, 1)
	go func() { wedged <- wedge(guestEnd, 42, 50*time.Millisecond) }()
	select {
	case <-first.Exited():
	case <-ctx.Done():
		t.Fatal("no exit for the command that ran wedgeagent")
	}
	if e, ok := first.ExitStatus(); !ok || e.Status != 42 {
		t.Fatalf("the takeover's exit: %+v %v, want status 42", e, ok)
	}
	if out, err := io.ReadAll(first); err != nil || len(out) != 0 {
		t.Errorf("the takeover's output: %q %v", out, err)
	}
	_ = first.Close()

	var info agentproto.Info
	if err := host.Call(ctx, agentproto.CallInfo, nil, &info); err != nil || !slices.Contains(info.Features, agentproto.FeatureTransfer) {
		t.Fatalf("info after the takeover: %+v %v", info, err)
	}
	if err := host.Call(ctx, agentproto.CallNetReady, agentproto.NetReady{}, nil); err == nil {
		t.Error("netready answered; want a refusal")
	}

	cmd, err := host.Open(ctx, agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"cat"}}})
	if err != nil {
		t.Fatalf("the wedged command: %v", err)
	}
	go func() { _, _ = io.Copy(cmd, strings.NewReader(strings.Repeat("x", 64<<20))) }()
	line := make([]byte, len("wedged\n"))
	if _, err := io.ReadFull(cmd, line); err != nil || string(line) != "wedged\n" {
		t.Fatalf("the wedged command's output: %q %v", line, err)
	}
	select {
	case <-cmd.Exited():
	case <-ctx.Done():
		t.Fatal("no exit for the wedged command")
	}
	if e, ok := cmd.ExitStatus(); !ok || e.Status != 0 {
		t.Fatalf("the wedged command's exit: %+v %v", e, ok)
	}
	if err := <-wedged; err != nil {
		t.Fatal(err)
	}
	// Its stdin is not read: the host's write ends at its deadline, and
	// the connection with it.
	select {
	case <-host.Done():
	case <-ctx.Done():
		t.Fatal("the host's stdin write to a guest that stopped reading did not end")
	}
	if err := host.Err(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the connection ended with %v, want a write deadline", err)
	}
}

// TestTakeoverFrames: the takeover's frames are an exit with the status
// and a close for each id from maxID down to 1.
func TestTakeoverFrames(t *testing.T) {
	r := strings.NewReader(string(takeoverFrames(42)))
	var buf []byte
	for id := uint32(maxID); id >= 1; id-- {
		for _, want := range []agentproto.FrameType{agentproto.FrameExit, agentproto.FrameClose} {
			f, err := agentproto.ReadFrame(r, &buf, agentproto.MaxGuestPayload)
			if err != nil || f.Type != want || f.ID != id {
				t.Fatalf("frame for id %d: %v %v %d, want %v", id, err, f.Type, f.ID, want)
			}
			if want == agentproto.FrameExit {
				if e, err := agentproto.DecodeExit(f.Payload); err != nil || e.Status != 42 {
					t.Fatalf("exit for id %d: %+v %v", id, e, err)
				}
			}
		}
	}
	if r.Len() != 0 {
		t.Errorf("%d bytes after the last close", r.Len())
	}
}
