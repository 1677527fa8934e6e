package agentproto

import (
	"bytes"
	"encoding"
	"reflect"
	"strings"
	"testing"
)

// message is a payload type: its wire form and back.
type message interface {
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// samples are values of every payload type, one or more each.
func samples() []message {
	return []message{
		&Hello{Protocol: Protocol},
		&HelloReply{Protocol: Protocol, AgentVersion: "v1.2"},
		&HelloReply{Protocol: 2, Error: "this agent speaks protocol 1, not 2"},
		&Call{Op: CallSetTime, Args: []byte{1, 2, 3}},
		&Call{Op: CallInfo},
		&Reply{Result: []byte("result")},
		&Reply{Error: "no such call"},
		&Open{Spec: ExecSpec{Argv: []string{"sh", "-c", "echo \xff"}, Env: []string{"A=1", "B="}, Dir: "/tmp", User: UnprivilegedUser}},
		&Open{Spec: ExecSpec{Argv: []string{"bash", "-l"}}, PTY: &PTY{Term: "xterm-256color", Columns: 132, Rows: 43}},
		&SetTime{UnixNano: 1_700_000_000_123_456_789, Entropy: bytes.Repeat([]byte{7}, 64)},
		&SetTime{UnixNano: 1},
		&Info{AgentVersion: "v", Kernel: "6.1.0", Hostname: "vmgate", BootID: "b", Features: []string{FeatureTransfer}},
		&NetReady{TimeoutMS: 60_000},
		&NetReadyStatus{Ready: true, Interface: "eth0", Address: "10.0.2.15/24", Gateway: "10.0.2.2", Resolver: "10.0.2.3", WaitedMS: 12},
		&NetReadyStatus{Detail: "no IPv4 address on eth0", WaitedMS: 60_000},
		&ProcStart{Spec: ExecSpec{Argv: []string{"sh", "-c", "sleep 9"}, Env: []string{"A=1"}, Dir: "/srv", User: "builder"},
			TimeoutMS: 60_000, BufferBytes: 1 << 20, Stdin: true, MaxProcs: 32},
		&ProcStart{Spec: ExecSpec{Argv: []string{"true"}}},
		&ProcInfo{Handle: 7, PID: 4242, Argv: []string{"make", "-j2"}, User: "root", Dir: "/root", State: ProcRunning,
			Started: 1_700_000_000_000_000_000, Out: 10, Err: 2, Next: 12, StdinOpen: true},
		&ProcInfo{Handle: 8, Argv: []string{"x"}, ArgvCut: true, State: ProcExited, Exit: &Exit{Signal: "KILL"}, TimedOut: true,
			Ended: 5, OutDropped: 1, ErrDropped: 3},
		&ProcInfo{Handle: 9, State: ProcExited, Exit: &Exit{Status: 127}},
		&ProcListQuery{After: 12},
		&ProcList{},
		&ProcList{Procs: []ProcInfo{{Handle: 1, State: ProcRunning}, {Handle: 2, State: ProcExited, Exit: &Exit{Status: 3}}}, More: true},
		&ProcLogs{Handle: 3, Since: 100, Max: MaxLogsChunk, WaitMS: 1000},
		&ProcOutput{Next: 5, Info: ProcInfo{Handle: 3, State: ProcRunning}},
		&ProcOutput{Chunks: []OutputChunk{{Stream: StreamStdout, Offset: 4, Data: []byte("out")}, {Stream: StreamStderr, Offset: 7, Data: []byte("err\xff")}},
			Next: 11, Dropped: 4, Info: ProcInfo{Handle: 3, State: ProcExited, Exit: &Exit{Status: 0}, Next: 11}},
		&ProcInput{Handle: 3, Data: []byte("input\n")},
		&ProcInput{Handle: 3, EOF: true},
		&ProcSignal{Handle: 3, Signal: "TERM"},
	}
}

// fresh returns a new zero value of m's type.
func fresh(m message) message {
	return reflect.New(reflect.TypeOf(m).Elem()).Interface().(message)
}

func TestCodecRoundTrip(t *testing.T) {
	for _, m := range samples() {
		b, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		got := fresh(m)
		if err := got.UnmarshalBinary(b); err != nil {
			t.Fatalf("%T %+v: %v", m, m, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%T: %+v decoded as %+v", m, m, got)
		}
		// Every shorter payload and every longer one is an error: each
		// message has exactly one length.
		for n := range len(b) {
			if err := fresh(m).UnmarshalBinary(b[:n]); err == nil && !restOK(m, n, len(b)) {
				t.Errorf("%T: %d of %d bytes accepted", m, n, len(b))
			}
		}
		if err := fresh(m).UnmarshalBinary(append(bytes.Clone(b), 0)); err == nil && !restOK(m, len(b)+1, len(b)) {
			t.Errorf("%T: a trailing byte accepted", m)
		}
	}
}

// restOK reports whether a payload of n bytes, not the full full, may
// decode: messages that end in a byte string of any length (the rest of
// the payload) accept any length past their fixed part.
func restOK(m message, n, full int) bool {
	fixed := map[string]int{"*agentproto.Call": -1, "*agentproto.Reply": 1, "*agentproto.SetTime": 8}
	f, ok := fixed[reflect.TypeOf(m).String()]
	if !ok {
		return false
	}
	if f < 0 { // Call: the op's length and bytes
		c := m.(*Call)
		f = 4 + len(c.Op)
	}
	return n >= f
}

func TestDecodeBounds(t *testing.T) {
	// A count that the payload cannot hold fails before any allocation.
	var o Open
	if err := o.UnmarshalBinary([]byte{0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0}); err == nil {
		t.Fatal("an argv of 2^31 strings accepted")
	}
	var info Info
	if err := info.UnmarshalBinary([]byte{0xff, 0xff, 0xff, 0xff}); err == nil {
		t.Fatal("a 4 GiB string accepted")
	}
	// Text from a guest is made valid UTF-8; argv passes byte for byte.
	b, _ := Info{Hostname: "bad\xffname"}.MarshalBinary()
	if err := info.UnmarshalBinary(b); err != nil || info.Hostname != "bad\uFFFDname" {
		t.Fatalf("hostname %q, %v", info.Hostname, err)
	}
	b, _ = Open{Spec: ExecSpec{Argv: []string{"\xff"}}}.MarshalBinary()
	if err := o.UnmarshalBinary(b); err != nil || o.Spec.Argv[0] != "\xff" {
		t.Fatalf("argv %q, %v", o.Spec.Argv, err)
	}
	// A reply without a reason still reads as a failure.
	var r Reply
	if err := r.UnmarshalBinary([]byte{1}); err != nil || r.Error == "" {
		t.Fatalf("reply %+v, %v", r, err)
	}
	if err := r.UnmarshalBinary([]byte{2}); err == nil || !strings.Contains(err.Error(), "flag") {
		t.Fatalf("a flag of 2: %v", err)
	}
}

func TestDecodeProcBounds(t *testing.T) {
	// A count of chunks or processes that the payload cannot hold fails
	// before any allocation.
	var out ProcOutput
	if err := out.UnmarshalBinary([]byte{0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0}); err == nil {
		t.Fatal("2^31 chunks accepted")
	}
	var list ProcList
	if err := list.UnmarshalBinary([]byte{0, 0, 0x10, 0, 1}); err == nil {
		t.Fatal("4096 processes in 5 bytes accepted")
	}
	// A chunk of a third stream, an exit's malformed signal name.
	b, _ := ProcOutput{Chunks: []OutputChunk{{Stream: 3, Data: []byte("x")}}}.MarshalBinary()
	if err := out.UnmarshalBinary(b); err == nil {
		t.Fatal("a chunk of stream 3 accepted")
	}
	b, _ = ProcInfo{State: ProcExited, Exit: &Exit{Signal: "kill me"}}.MarshalBinary()
	var info ProcInfo
	if err := info.UnmarshalBinary(b); err == nil {
		t.Fatal("a signal name of lower case and a space accepted")
	}
}

func TestProcErrorCode(t *testing.T) {
	for _, tc := range []struct{ msg, code, detail string }{
		{"no-handle: no process 7", ProcErrNoHandle, "no process 7"},
		{"limit: 32 processes run", ProcErrLimit, "32 processes run"},
		{"ended: process 3 has ended", ProcErrEnded, "process 3 has ended"},
		{"busy: 1048576 bytes not read", ProcErrBusy, "1048576 bytes not read"},
		{"invalid: since 9 past 4", ProcErrInvalid, "since 9 past 4"},
		{"unknown call \"proc.start\"", "", "unknown call \"proc.start\""},
		{"no-handle", "", "no-handle"},
		{"other: x", "", "other: x"},
	} {
		if code, detail := ProcErrorCode(tc.msg); code != tc.code || detail != tc.detail {
			t.Errorf("ProcErrorCode(%q) = %q, %q; want %q, %q", tc.msg, code, detail, tc.code, tc.detail)
		}
	}
}

// FuzzDecode: any payload decodes into each message type or fails, never
// panics; what decodes re-encodes and decodes to the same value.
func FuzzDecode(f *testing.F) {
	for _, m := range samples() {
		b, _ := m.MarshalBinary()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, p []byte) {
		for _, m := range samples() {
			got := fresh(m)
			if err := got.UnmarshalBinary(p); err != nil {
				continue
			}
			b, err := got.MarshalBinary()
			if err != nil {
				t.Fatalf("%T: %v", got, err)
			}
			again := fresh(m)
			if err := again.UnmarshalBinary(b); err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("%T %+v: re-decoded as %+v, %v", got, got, again, err)
			}
		}
	})
}

// TestDecodeDoesNotAlias: a decoded message owns its bytes. The host's
// reader decodes a Reply from the frame buffer and hands it to the caller
// waiting for it, then reads the guest's next frame into the same buffer;
// a Result that aliased the buffer changed under the caller (a data race
// under -race, issue 30 finding 11).
func TestDecodeDoesNotAlias(t *testing.T) {
	for _, m := range []message{
		&Reply{Result: []byte("the first reply's result")},
		&Call{Op: CallSetTime, Args: []byte("the first call's args")},
		&SetTime{UnixNano: 1, Entropy: []byte("the first entropy")},
	} {
		b, _ := m.MarshalBinary()
		var stream bytes.Buffer
		stream.Write(AppendFrame(nil, FrameReply, 1, b))
		stream.Write(AppendFrame(nil, FrameReply, 2, bytes.Repeat([]byte{0xee}, len(b))))
		var buf []byte
		f, err := ReadFrame(&stream, &buf, MaxGuestPayload)
		if err != nil {
			t.Fatal(err)
		}
		got := fresh(m)
		if err := got.UnmarshalBinary(f.Payload); err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if _, err := ReadFrame(&stream, &buf, MaxGuestPayload); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%T: after the next frame was read into the buffer, %+v became %+v", m, m, got)
		}
	}
}
