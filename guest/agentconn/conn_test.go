package agentconn

import (
	"bytes"
	"context"
	"encoding"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
	"github.com/vmgate/vmgate/internal/testutil"
)

// testTimeout bounds every wait in these tests.
const testTimeout = 10 * time.Second

// testHandler is a guest handler whose "commands" are argv[0]:
//
//	echo CODE     stdin to stdout, "e:" and stdin to stderr, exit CODE
//	flood N       N bytes on stdout, exit 0
//	events        prints each signal and resize; exits by the signal KILL
//	refuse        refused
//	hang          never answers the open
type testHandler struct {
	closed chan string // the commands whose channel the host closed while they ran
}

// raw is a call's argument or result as it is on the wire.
type raw []byte

func (r raw) MarshalBinary() ([]byte, error) { return r, nil }

func (r *raw) UnmarshalBinary(p []byte) error {
	*r = append((*r)[:0], p...)
	return nil
}

func (h *testHandler) Call(ctx context.Context, op string, args []byte) (encoding.BinaryMarshaler, error) {
	switch op {
	case "echo":
		return raw(args), nil
	case "block":
		<-ctx.Done()
		return nil, ctx.Err()
	case "huge":
		return raw(strings.Repeat("x", agentproto.MaxGuestPayload)), nil
	}
	return nil, fmt.Errorf("unknown call %q", op)
}

func (h *testHandler) Open(ctx context.Context, ch *Channel, o agentproto.Open) {
	argv := o.Spec.Argv
	switch argv[0] {
	case "refuse":
		_ = ch.Reject("refused: " + strings.Join(argv[1:], " "))
		return
	case "hang":
		for {
			if _, ok := ch.NextEvent(); !ok {
				return
			}
		}
	}
	_ = ch.Accept()
	switch argv[0] {
	case "echo":
		in, _ := io.ReadAll(ch)
		_, _ = ch.Write(in)
		_, _ = fmt.Fprintf(ch.Stderr(), "e:%s", in)
		code, _ := strconv.Atoi(argv[1])
		_ = ch.CloseWrite()
		_ = ch.Exit(agentproto.Exit{Status: uint32(code)})
	case "flood":
		n, _ := strconv.Atoi(argv[1])
		_, _ = ch.Write(bytes.Repeat([]byte("f"), n))
		_ = ch.CloseWrite()
		_ = ch.Exit(agentproto.Exit{})
	case "events":
		for {
			e, ok := ch.NextEvent()
			if !ok {
				h.closed <- argv[0]
				return
			}
			if e.Signal == "KILL" {
				_ = ch.CloseWrite()
				_ = ch.Exit(agentproto.Exit{Signal: "KILL"})
				return
			}
			_, _ = fmt.Fprintf(ch, "%s %d %d\n", e.Signal, e.Columns, e.Rows)
		}
	}
}

// pair serves a testHandler on one end of a socket pair and returns the
// host's connection, after its hello.
func pair(t *testing.T) (*Conn, *testHandler, chan error) {
	t.Helper()
	guestEnd, hostEnd := testutil.SocketPair(t)
	h := &testHandler{closed: make(chan string, 16)}
	served := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		_, err := Serve(ctx, guestEnd, ServeConfig{Handler: h, AgentVersion: "test"})
		served <- err
	}()
	c := Client(hostEnd, nil)
	t.Cleanup(func() {
		c.Close()
		select {
		case <-served:
		case <-time.After(testTimeout):
			t.Error("Serve did not return after the host hung up")
		}
		cancel()
	})
	r, err := c.Hello(testCtx(t))
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	if r.AgentVersion != "test" || r.Protocol != agentproto.Protocol {
		t.Fatalf("hello reply %+v", r)
	}
	return c, h, served
}

// testCtx is t.Context() bounded by testTimeout: a hang fails the test,
// not the whole run.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

func TestCall(t *testing.T) {
	c, _, _ := pair(t)
	var got raw
	if err := c.Call(testCtx(t), "echo", raw("a\x00\xff"), &got); err != nil || string(got) != "a\x00\xff" {
		t.Fatalf("echo: %q %v", got, err)
	}
	err := c.Call(testCtx(t), "nope", nil, nil)
	var ce *CallError
	if !errors.As(err, &ce) || ce.Op != "nope" || !strings.Contains(ce.Msg, "unknown call") {
		t.Fatalf("unknown call: %v", err)
	}
	// A result too large for a guest frame is an error reply, not a
	// broken connection.
	if err := c.Call(testCtx(t), "huge", nil, nil); !errors.As(err, &ce) {
		t.Fatalf("huge: %v", err)
	}
	// A call whose caller gives up: its late reply is dropped and the
	// connection goes on.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Call(ctx, "block", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("block: %v", err)
	}
	if err := c.Call(testCtx(t), "echo", raw("1"), nil); err != nil {
		t.Fatalf("after an abandoned call: %v", err)
	}
}

// run runs a command on a new channel, feeding stdin, and returns its
// output and exit record.
func run(t *testing.T, c *Conn, argv []string, stdin []byte) (stdout, stderr string, e agentproto.Exit) {
	t.Helper()
	ch, err := c.Open(testCtx(t), agentproto.Open{Spec: agentproto.ExecSpec{Argv: argv}})
	if err != nil {
		t.Fatalf("open %v: %v", argv, err)
	}
	defer ch.Close()
	var so, se bytes.Buffer
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = io.Copy(&so, ch) })
	wg.Go(func() { _, _ = io.Copy(&se, ch.Stderr()) })
	if _, err := ch.Write(stdin); err != nil {
		t.Fatalf("stdin: %v", err)
	}
	if err := ch.CloseWrite(); err != nil {
		t.Fatalf("stdin eof: %v", err)
	}
	select {
	case <-ch.Exited():
	case <-time.After(testTimeout):
		t.Fatal("no exit record")
	}
	wg.Wait()
	e, ok := ch.ExitStatus()
	if !ok {
		t.Fatal("channel ended without an exit record")
	}
	return so.String(), se.String(), e
}

func TestExecStreams(t *testing.T) {
	c, _, _ := pair(t)
	in := bytes.Repeat([]byte("0123456789"), 3*agentproto.Window/10) // past the window both ways
	so, se, e := run(t, c, []string{"echo", "7"}, in)
	if so != string(in) || se != "e:"+string(in) || e.Status != 7 || e.Signal != "" {
		t.Fatalf("stdout %d bytes, stderr %d bytes, exit %+v", len(so), len(se), e)
	}
	// Several at once on one connection.
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			so, _, e := run(t, c, []string{"echo", strconv.Itoa(i)}, []byte(strconv.Itoa(i)))
			if so != strconv.Itoa(i) || e.Status != uint32(i) {
				t.Errorf("command %d: %q, exit %+v", i, so, e)
			}
		})
	}
	wg.Wait()
}

func TestOpenRefused(t *testing.T) {
	c, _, _ := pair(t)
	_, err := c.Open(testCtx(t), agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"refuse", "no", "such", "user"}}})
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != "refused: no such user" {
		t.Fatalf("open: %v", err)
	}
	// The connection goes on.
	if so, _, _ := run(t, c, []string{"echo", "0"}, []byte("ok")); so != "ok" {
		t.Fatalf("after a refusal: %q", so)
	}
}

func TestEventsAndHostClose(t *testing.T) {
	c, h, _ := pair(t)
	ch, err := c.Open(testCtx(t), agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"events"}}})
	if err != nil {
		t.Fatal(err)
	}
	// Signals and resizes travel although stdin is closed.
	if err := ch.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := ch.Signal("TERM"); err != nil {
		t.Fatal(err)
	}
	if err := ch.Resize(100, 30); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	var got string
	for strings.Count(got, "\n") < 2 {
		n, err := ch.Read(buf)
		if err != nil {
			t.Fatalf("read: %v (so far %q)", err, got)
		}
		got += string(buf[:n])
	}
	if got != "TERM 0 0\n 100 30\n" {
		t.Fatalf("events: %q", got)
	}
	// The host's close ends the guest's channel: its handler sees the
	// end of events.
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("read after close: %v", err)
	}
	if _, err := ch.Write([]byte("x")); err == nil {
		t.Fatal("write after close succeeded")
	}
	select {
	case name := <-h.closed:
		if name != "events" {
			t.Fatalf("closed %q", name)
		}
	case <-time.After(testTimeout):
		t.Fatal("the guest's handler never saw the close")
	}
}

func TestExitBySignal(t *testing.T) {
	c, _, _ := pair(t)
	ch, err := c.Open(testCtx(t), agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"events"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Signal("KILL"); err != nil {
		t.Fatal(err)
	}
	<-ch.Exited()
	if e, ok := ch.ExitStatus(); !ok || e.Signal != "KILL" {
		t.Fatalf("exit %+v %v", e, ok)
	}
}

// rawGuest is a guest end driven by the test frame by frame.
type rawGuest struct {
	t    *testing.T
	conn net.Conn
	buf  []byte
}

// rawPair connects a host Conn to a rawGuest and reads the host's hello.
func rawPair(t *testing.T) (*Conn, *rawGuest) {
	t.Helper()
	guestEnd, hostEnd := testutil.SocketPair(t)
	c := Client(hostEnd, nil)
	t.Cleanup(func() { c.Close() })
	g := &rawGuest{t: t, conn: guestEnd}
	if f := g.read(); f.Type != agentproto.FrameHello {
		t.Fatalf("first frame %v", f.Type)
	}
	return c, g
}

func (g *rawGuest) read() agentproto.Frame {
	g.t.Helper()
	_ = g.conn.SetReadDeadline(time.Now().Add(testTimeout))
	f, err := agentproto.ReadFrame(g.conn, &g.buf, agentproto.MaxHostPayload)
	if err != nil {
		g.t.Fatalf("read frame: %v", err)
	}
	return f
}

func (g *rawGuest) send(t agentproto.FrameType, id uint32, p []byte) {
	_, _ = g.conn.Write(agentproto.AppendFrame(nil, t, id, p))
}

func (g *rawGuest) hello() {
	g.send(agentproto.FrameHello, 0, helloReply(agentproto.HelloReply{Protocol: agentproto.Protocol, AgentVersion: "raw"}))
}

func helloReply(r agentproto.HelloReply) []byte {
	b, _ := r.MarshalBinary()
	return b
}

// open has the host open a channel and answers it; it returns the host's
// channel.
func (g *rawGuest) open(c *Conn) *Channel {
	g.t.Helper()
	type res struct {
		ch  *Channel
		err error
	}
	done := make(chan res, 1)
	go func() {
		ch, err := c.Open(testCtx(g.t), agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"x"}}})
		done <- res{ch, err}
	}()
	f := g.read()
	if f.Type != agentproto.FrameOpen {
		g.t.Fatalf("frame %v, want open", f.Type)
	}
	g.send(agentproto.FrameOpenOK, f.ID, nil)
	r := <-done
	if r.err != nil {
		g.t.Fatal(r.err)
	}
	return r.ch
}

func TestHostWaitsForWindow(t *testing.T) {
	c, g := rawPair(t)
	g.hello()
	ch := g.open(c)
	wrote := make(chan error, 1)
	go func() {
		_, err := ch.Write(make([]byte, agentproto.Window+agentproto.MaxData))
		wrote <- err
	}()
	total := 0
	for total < agentproto.Window {
		f := g.read()
		if f.Type != agentproto.FrameData || len(f.Payload) > agentproto.MaxData {
			t.Fatalf("frame %v of %d bytes", f.Type, len(f.Payload))
		}
		total += len(f.Payload)
	}
	if total != agentproto.Window {
		t.Fatalf("the host sent %d bytes on a window of %d", total, agentproto.Window)
	}
	// A grant of 10 bytes lets exactly 10 more through.
	g.send(agentproto.FrameWindow, ch.id, agentproto.EncodeUint32(10))
	if f := g.read(); f.Type != agentproto.FrameData || len(f.Payload) != 10 {
		t.Fatalf("after a grant of 10: %v of %d bytes", f.Type, len(f.Payload))
	}
	select {
	case err := <-wrote:
		t.Fatalf("write returned (%v) with its data not all sent", err)
	default:
	}
	// The guest hangs up: the blocked write fails.
	g.conn.Close()
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("write succeeded on a dead connection")
		}
	case <-time.After(testTimeout):
		t.Fatal("write still blocked after the guest hung up")
	}
}

func TestHostGrantsWindowAsItReads(t *testing.T) {
	c, g := rawPair(t)
	g.hello()
	ch := g.open(c)
	chunk := make([]byte, agentproto.MaxData)
	for sent := 0; sent < agentproto.Window; sent += len(chunk) {
		g.send(agentproto.FrameData, ch.id, chunk)
	}
	buf := make([]byte, agentproto.Window)
	if _, err := io.ReadFull(ch, buf[:agentproto.Window/2]); err != nil {
		t.Fatal(err)
	}
	f := g.read()
	n, err := agentproto.DecodeWindow(f.Payload)
	if f.Type != agentproto.FrameWindow || err != nil || n != agentproto.Window/2 {
		t.Fatalf("after reading half the window: %v %d %v", f.Type, n, err)
	}
}

// TestHostRejectsHostileGuest: each of these ends the connection with a
// protocol error, without the host buffering past its bounds.
func TestHostRejectsHostileGuest(t *testing.T) {
	chunk := make([]byte, agentproto.MaxData)
	for _, tc := range []struct {
		name  string
		open  bool // answer the hello and open a channel first
		send  func(g *rawGuest, id uint32)
		want  string
		isSSH bool
	}{
		{name: "frame before hello", send: func(g *rawGuest, _ uint32) { g.send(agentproto.FrameData, 1, []byte("x")) }, want: "before hello"},
		{name: "an SSH agent", send: func(g *rawGuest, _ uint32) { _, _ = g.conn.Write([]byte("SSH-2.0-vmgate-agent\r\n")) }, isSSH: true},
		{name: "hello of another protocol", send: func(g *rawGuest, _ uint32) {
			g.send(agentproto.FrameHello, 0, helloReply(agentproto.HelloReply{Protocol: 2}))
		}, want: "protocol 2"},
		{name: "hello refused", send: func(g *rawGuest, _ uint32) {
			g.send(agentproto.FrameHello, 0, helloReply(agentproto.HelloReply{Protocol: 1, Error: "no"}))
		}, want: "refused the connection: no"},
		{name: "hello cut short", send: func(g *rawGuest, _ uint32) { g.send(agentproto.FrameHello, 0, []byte{0, 0, 0, 1, 0, 0}) }, want: "hello reply"},
		{name: "second hello", open: true, send: func(g *rawGuest, _ uint32) { g.hello() }, want: "second hello"},
		{name: "oversized frame", open: true, send: func(g *rawGuest, id uint32) {
			_, _ = g.conn.Write(agentproto.AppendFrame(nil, agentproto.FrameData, id, nil)[:5])
			_, _ = g.conn.Write([]byte{0, 0, 0, 0})
			g.conn.Close()
		}, want: ""},
		{name: "a host's frame", open: true, send: func(g *rawGuest, id uint32) { g.send(agentproto.FrameSignal, id, []byte("KILL")) }, want: "signal frame from the guest"},
		{name: "an open", open: true, send: func(g *rawGuest, _ uint32) { g.send(agentproto.FrameOpen, 9, []byte("{}")) }, want: "open frame from the guest"},
		{name: "id 0", open: true, send: func(g *rawGuest, _ uint32) { g.send(agentproto.FrameExit, 0, agentproto.EncodeExit(agentproto.Exit{})) }, want: "id 0"},
		{name: "past the window", open: true, send: func(g *rawGuest, id uint32) {
			for sent := 0; sent <= agentproto.Window; sent += len(chunk) {
				g.send(agentproto.FrameStderr, id, chunk)
			}
		}, want: "past its window"},
		{name: "data frame too large", open: true, send: func(g *rawGuest, id uint32) {
			g.send(agentproto.FrameData, id, make([]byte, agentproto.MaxData+1))
		}, want: "data frame of"},
		{name: "data after eof", open: true, send: func(g *rawGuest, id uint32) {
			g.send(agentproto.FrameEOF, id, nil)
			g.send(agentproto.FrameData, id, []byte("x"))
		}, want: "data after eof"},
		{name: "second exit", open: true, send: func(g *rawGuest, id uint32) {
			g.send(agentproto.FrameExit, id, agentproto.EncodeExit(agentproto.Exit{}))
			g.send(agentproto.FrameExit, id, agentproto.EncodeExit(agentproto.Exit{}))
		}, want: "second exit"},
		{name: "malformed exit", open: true, send: func(g *rawGuest, id uint32) { g.send(agentproto.FrameExit, id, []byte{9}) }, want: "exit"},
		{name: "frame after close", open: true, send: func(g *rawGuest, id uint32) {
			g.send(agentproto.FrameClose, id, nil)
			g.send(agentproto.FrameEOF, id, nil)
		}, want: "after close"},
		{name: "window overflow", open: true, send: func(g *rawGuest, id uint32) {
			for range 5 {
				g.send(agentproto.FrameWindow, id, agentproto.EncodeUint32(1<<30))
			}
		}, want: "past 2 GiB"},
		{name: "second answer", open: true, send: func(g *rawGuest, id uint32) { g.send(agentproto.FrameOpenOK, id, nil) }, want: "open-ok frame on channel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, g := rawPair(t)
			var id uint32
			if tc.open {
				g.hello()
				id = g.open(c).id
			}
			tc.send(g, id)
			select {
			case <-c.Done():
			case <-time.After(testTimeout):
				t.Fatal("the host kept the connection")
			}
			err := c.Err()
			if tc.isSSH {
				if !errors.Is(err, agentproto.ErrSSHAgent) {
					t.Fatalf("error %v, want ErrSSHAgent", err)
				}
				return
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			var pe *ProtocolError
			if tc.want != "" && !errors.As(err, &pe) {
				t.Fatalf("error %v is not a protocol error", err)
			}
		})
	}
}

func TestHostDropsFramesOfForgottenChannels(t *testing.T) {
	c, g := rawPair(t)
	g.hello()
	ch := g.open(c)
	_ = ch.Close()
	if f := g.read(); f.Type != agentproto.FrameClose || f.ID != ch.id {
		t.Fatalf("frame %v %d, want close %d", f.Type, f.ID, ch.id)
	}
	// What the guest sent before it saw the close, and frames for ids
	// never opened, are dropped.
	g.send(agentproto.FrameData, ch.id, []byte("late"))
	g.send(agentproto.FrameExit, ch.id, agentproto.EncodeExit(agentproto.Exit{}))
	g.send(agentproto.FrameClose, 77, nil)
	// The connection is still up: a call goes through.
	done := make(chan error, 1)
	go func() { done <- c.Call(testCtx(t), "x", nil, nil) }()
	f := g.read()
	if f.Type != agentproto.FrameCall {
		t.Fatalf("frame %v", f.Type)
	}
	g.send(agentproto.FrameReply, f.ID, []byte{0})
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestConnEndWakesEveryone(t *testing.T) {
	c, g := rawPair(t)
	g.hello()
	ch := g.open(c)
	call := make(chan error, 1)
	go func() { call <- c.Call(testCtx(t), "x", nil, nil) }()
	open := make(chan error, 1)
	go func() {
		_, err := c.Open(testCtx(t), agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"y"}}})
		open <- err
	}()
	read := make(chan error, 1)
	go func() { _, err := ch.Read(make([]byte, 1)); read <- err }()
	// Both frames have left the host before the guest hangs up.
	g.read()
	g.read()
	g.conn.Close()
	for name, c := range map[string]chan error{"call": call, "open": open, "read": read} {
		select {
		case err := <-c:
			if err == nil {
				t.Errorf("%s succeeded", name)
			}
		case <-time.After(testTimeout):
			t.Fatalf("%s still blocked", name)
		}
	}
	<-ch.Exited()
	if _, ok := ch.ExitStatus(); ok {
		t.Fatal("an exit record from nowhere")
	}
	if !errors.Is(c.Err(), ErrClosed) {
		t.Fatalf("Err %v", c.Err())
	}
}

func TestServeEnds(t *testing.T) {
	t.Run("not the protocol", func(t *testing.T) {
		guestEnd, hostEnd := testutil.SocketPair(t)
		go func() { _, _ = hostEnd.Write([]byte("SSH-2.0-Go\r\n")) }()
		hello, err := Serve(context.Background(), guestEnd, ServeConfig{Handler: &testHandler{closed: make(chan string, 16)}})
		if hello || err == nil {
			t.Fatalf("hello %v, err %v", hello, err)
		}
	})
	t.Run("ctx ends", func(t *testing.T) {
		guestEnd, hostEnd := testutil.SocketPair(t)
		c := Client(hostEnd, nil)
		defer c.Close()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := Serve(ctx, guestEnd, ServeConfig{Handler: &testHandler{closed: make(chan string, 16)}})
			done <- err
		}()
		if _, err := c.Hello(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		ch, err := c.Open(testCtx(t), agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"events"}}})
		if err != nil {
			t.Fatal(err)
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Serve: %v", err)
			}
		case <-time.After(testTimeout):
			t.Fatal("Serve did not return")
		}
		<-ch.Exited()
	})
	t.Run("host hangs up", func(t *testing.T) {
		c, _, served := pair(t)
		c.Close()
		select {
		case err := <-served:
			if err != nil {
				t.Fatalf("Serve: %v", err)
			}
			served <- err // for the cleanup
		case <-time.After(testTimeout):
			t.Fatal("Serve did not return")
		}
	})
}

// FuzzHostReader: whatever a guest sends after its hello and the answer
// to an open, the host neither panics nor holds more than the window,
// and every goroutine ends with the connection.
func FuzzHostReader(f *testing.F) {
	chunk := []byte("output")
	f.Add(agentproto.AppendFrame(agentproto.AppendFrame(nil, agentproto.FrameData, 1, chunk), agentproto.FrameExit, 1, agentproto.EncodeExit(agentproto.Exit{Status: 3})))
	f.Add(agentproto.AppendFrame(nil, agentproto.FrameStderr, 1, make([]byte, 100)))
	f.Add(agentproto.AppendFrame(nil, agentproto.FrameReply, 1, []byte{1, 'n', 'o'}))
	f.Add(agentproto.AppendFrame(nil, agentproto.FrameClose, 1, nil))
	f.Add([]byte{0, 0, 0, 9, 7, 0, 0, 0, 1, 'a', 'b', 'c', 'd'})
	f.Fuzz(func(t *testing.T, stream []byte) {
		guestEnd, hostEnd := testutil.SocketPair(t)
		c := Client(hostEnd, nil)
		defer c.Close()
		g := &rawGuest{t: t, conn: guestEnd}
		g.read() // the hello
		g.hello()
		opened := make(chan *Channel, 1)
		go func() {
			ch, _ := c.Open(context.Background(), agentproto.Open{Spec: agentproto.ExecSpec{Argv: []string{"x"}}})
			opened <- ch
		}()
		g.read() // the open
		g.send(agentproto.FrameOpenOK, 1, nil)
		ch := <-opened
		go func() { _, _ = io.Copy(io.Discard, guestEnd) }()
		_, _ = guestEnd.Write(stream)
		if ch != nil {
			ch.mu.Lock()
			held := len(ch.in[0]) + len(ch.in[1])
			ch.mu.Unlock()
			if held > agentproto.Window {
				t.Fatalf("the host holds %d bytes of one channel", held)
			}
		}
		guestEnd.Close()
		<-c.Done()
		if ch != nil {
			<-ch.Exited()
		}
	})
}
