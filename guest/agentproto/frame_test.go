package agentproto

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var stream []byte
	frames := []Frame{
		{FrameHello, 0, []byte(`{"protocol":1}`)},
		{FrameData, 7, bytes.Repeat([]byte{0xff}, MaxData)},
		{FrameEOF, 7, nil},
		{FrameWindow, 1 << 31, EncodeUint32(12345)},
	}
	for _, f := range frames {
		stream = AppendFrame(stream, f.Type, f.ID, f.Payload)
	}
	r := bytes.NewReader(stream)
	var buf []byte
	for i, want := range frames {
		got, err := ReadFrame(r, &buf, MaxGuestPayload)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if got.Type != want.Type || got.ID != want.ID || !bytes.Equal(got.Payload, want.Payload) {
			t.Fatalf("frame %d: got %v %d (%d bytes), want %v %d (%d bytes)", i, got.Type, got.ID, len(got.Payload), want.Type, want.ID, len(want.Payload))
		}
	}
	if _, err := ReadFrame(r, &buf, MaxGuestPayload); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestReadFrameErrors(t *testing.T) {
	big := AppendFrame(nil, FrameData, 1, make([]byte, MaxGuestPayload+1))
	for _, tc := range []struct {
		name   string
		stream []byte
		want   error  // errors.Is, or nil to check text
		text   string // substring of the error
	}{
		{"too large", big[:HeaderSize], ErrFrameTooLarge, ""},
		{"length below header", []byte{0, 0, 0, 4, 1, 0, 0, 0, 0}, nil, "shorter than its header"},
		{"cut in the header", []byte{0, 0, 0, 5, 1}, io.ErrUnexpectedEOF, ""},
		{"cut in the payload", AppendFrame(nil, FrameData, 1, []byte("hello"))[:12], io.ErrUnexpectedEOF, ""},
		{"an SSH banner", []byte("SSH-2.0-vmgate-agent\r\n"), ErrSSHAgent, ""},
		{"a short SSH banner", []byte("SSH-2"), ErrSSHAgent, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf []byte
			_, err := ReadFrame(bytes.NewReader(tc.stream), &buf, MaxGuestPayload)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want %v", err, tc.want)
			}
			if tc.text != "" && !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("error %q does not contain %q", err, tc.text)
			}
			if cap(buf) > MaxGuestPayload {
				t.Fatalf("buffer grew to %d", cap(buf))
			}
		})
	}
}

func TestFrameDirections(t *testing.T) {
	for ft := FrameType(0); ft < 20; ft++ {
		name := ft.String()
		if ft.FromHost() || ft.FromGuest() {
			if strings.HasPrefix(name, "frame-type-") {
				t.Errorf("%d is sent but has no name", ft)
			}
		}
	}
	if FrameStderr.FromHost() || FrameExit.FromHost() || FrameReply.FromHost() || FrameOpenOK.FromHost() {
		t.Error("a guest-only frame is allowed from the host")
	}
	if FrameSignal.FromGuest() || FrameOpen.FromGuest() || FrameCall.FromGuest() || FrameResize.FromGuest() {
		t.Error("a host-only frame is allowed from the guest")
	}
}

func TestExitEncoding(t *testing.T) {
	for _, e := range []Exit{{Status: 0}, {Status: 255}, {Status: 1 << 31}, {Signal: "KILL"}, {Signal: "SEGV", CoreDumped: true}} {
		got, err := DecodeExit(EncodeExit(e))
		if err != nil || got != e {
			t.Errorf("%+v: decoded %+v, %v", e, got, err)
		}
	}
	for _, p := range [][]byte{nil, {0}, {0, 0, 0, 0}, {0, 0, 0, 0, 0, 0}, {1, 0}, {1, 2, 'K'}, {1, 0, 'k'}, {1, 0, ' '},
		append([]byte{1, 0}, strings.Repeat("A", maxSignalName+1)...), {2, 0, 0, 0, 0}} {
		if e, err := DecodeExit(p); err == nil {
			t.Errorf("%q decoded as %+v", p, e)
		}
	}
}

func TestSmallPayloads(t *testing.T) {
	if n, err := DecodeWindow(EncodeUint32(7)); n != 7 || err != nil {
		t.Errorf("window: %d, %v", n, err)
	}
	for _, p := range [][]byte{nil, {0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 1, 0}} {
		if _, err := DecodeWindow(p); err == nil {
			t.Errorf("window %v accepted", p)
		}
	}
	if c, r, err := DecodeResize(EncodeResize(132, 43)); c != 132 || r != 43 || err != nil {
		t.Errorf("resize: %d %d %v", c, r, err)
	}
	if _, _, err := DecodeResize([]byte{1, 2, 3}); err == nil {
		t.Error("short resize accepted")
	}
	if s, err := DecodeSignal([]byte("TERM")); s != "TERM" || err != nil {
		t.Errorf("signal: %q %v", s, err)
	}
	for _, p := range []string{"", "term", "SIG TERM", strings.Repeat("X", 17)} {
		if _, err := DecodeSignal([]byte(p)); err == nil {
			t.Errorf("signal %q accepted", p)
		}
	}
	if s, err := DecodeReason([]byte("no such user")); s != "no such user" || err != nil {
		t.Errorf("reason: %q %v", s, err)
	}
	if _, err := DecodeReason([]byte{0xff}); err == nil {
		t.Error("non-UTF-8 reason accepted")
	}
	if _, err := DecodeReason(make([]byte, MaxReason+1)); err == nil {
		t.Error("oversized reason accepted")
	}
}

// FuzzReadFrame: any stream decodes into frames within the bound, or an
// error; a frame re-encodes to the bytes it came from.
func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, FrameHello, 0, []byte(`{"protocol":1}`)))
	f.Add(AppendFrame(AppendFrame(nil, FrameData, 3, []byte("abc")), FrameExit, 3, EncodeExit(Exit{Signal: "KILL"})))
	f.Add([]byte("SSH-2.0-x\r\n"))
	f.Add([]byte{0, 0, 0, 4})
	f.Fuzz(func(t *testing.T, stream []byte) {
		r := bytes.NewReader(stream)
		var buf []byte
		off := 0
		for {
			fr, err := ReadFrame(r, &buf, 1024)
			if err != nil {
				return
			}
			if len(fr.Payload) > 1024 {
				t.Fatalf("payload of %d bytes", len(fr.Payload))
			}
			enc := AppendFrame(nil, fr.Type, fr.ID, fr.Payload)
			if !bytes.Equal(enc, stream[off:off+len(enc)]) {
				t.Fatalf("frame at %d re-encodes differently", off)
			}
			off += len(enc)
			// The payload decoders never panic on what a peer sends.
			_, _ = DecodeExit(fr.Payload)
			_, _ = DecodeWindow(fr.Payload)
			_, _, _ = DecodeResize(fr.Payload)
			_, _ = DecodeSignal(fr.Payload)
			_, _ = DecodeReason(fr.Payload)
		}
	})
}
