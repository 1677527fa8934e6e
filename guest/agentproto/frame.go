package agentproto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// Protocol is the version of the framed protocol this package describes.
// The host sends it in its Hello; an agent that speaks another version
// answers with HelloReply.Error.
const Protocol = 1

// FrameType says what a frame carries. Each type travels in one direction
// only (H: host to guest, G: guest to host), except where both are named.
type FrameType uint8

// Frame types.
const (
	FrameHello    FrameType = 1  // H, G; id 0: Hello (H), HelloReply (G); JSON
	FrameCall     FrameType = 2  // H; id: the call; JSON Call
	FrameReply    FrameType = 3  // G; id: the call answered; JSON Reply
	FrameOpen     FrameType = 4  // H; id: a new channel; JSON Open
	FrameOpenOK   FrameType = 5  // G; the command was accepted; empty
	FrameOpenFail FrameType = 6  // G; the command was refused; a UTF-8 reason; the channel is over
	FrameData     FrameType = 7  // H, G; stdin (H), stdout or a terminal's output (G)
	FrameStderr   FrameType = 8  // G; stderr
	FrameEOF      FrameType = 9  // H, G; no more data from the sender; empty
	FrameWindow   FrameType = 10 // H, G; credit for more data; uint32
	FrameSignal   FrameType = 11 // H; a signal for the command's process group; its name
	FrameResize   FrameType = 12 // H; the terminal's new size; uint32 columns, uint32 rows
	FrameExit     FrameType = 13 // G; how the command ended; Exit encoding
	FrameClose    FrameType = 14 // H, G; the sender is done with the channel; empty
)

var frameNames = [...]string{
	FrameHello: "hello", FrameCall: "call", FrameReply: "reply", FrameOpen: "open", FrameOpenOK: "open-ok",
	FrameOpenFail: "open-fail", FrameData: "data", FrameStderr: "stderr", FrameEOF: "eof", FrameWindow: "window",
	FrameSignal: "signal", FrameResize: "resize", FrameExit: "exit", FrameClose: "close",
}

func (t FrameType) String() string {
	if int(t) < len(frameNames) && frameNames[t] != "" {
		return frameNames[t]
	}
	return fmt.Sprintf("frame-type-%d", uint8(t))
}

// FromHost reports whether the host may send t, FromGuest whether the
// guest may.
func (t FrameType) FromHost() bool {
	switch t {
	case FrameHello, FrameCall, FrameOpen, FrameData, FrameEOF, FrameWindow, FrameSignal, FrameResize, FrameClose:
		return true
	}
	return false
}

// FromGuest: see FromHost.
func (t FrameType) FromGuest() bool {
	switch t {
	case FrameHello, FrameReply, FrameOpenOK, FrameOpenFail, FrameData, FrameStderr, FrameEOF, FrameWindow, FrameExit, FrameClose:
		return true
	}
	return false
}

// HeaderSize is the size of a frame's header: its length (uint32, the
// bytes after the length field), its type (uint8) and its id (uint32),
// big-endian.
const HeaderSize = 9

// Frame payload bounds. MaxData bounds the payload of a data frame
// (FrameData, FrameStderr). What the host sends is bounded by
// MaxHostPayload (an Open carries a command line that policy allows up to
// 256 KiB, in JSON); what the guest sends, which the host reads from an
// untrusted peer, by MaxGuestPayload.
const (
	MaxData         = 32 << 10
	MaxHostPayload  = 4 << 20
	MaxGuestPayload = 64 << 10
	// MaxReason bounds a FrameOpenFail's reason.
	MaxReason = 4 << 10
)

// Window is every channel's initial credit in each direction: the bytes
// of data frames a sender may send before the receiver grants more with
// FrameWindow. A receiver therefore never holds more than Window bytes of
// one channel's data that its consumer has not read.
const Window = 512 << 10

// Frame is one decoded frame. Its Payload aliases the reader's buffer and
// is valid until the next ReadFrame with that buffer.
type Frame struct {
	Type    FrameType
	ID      uint32
	Payload []byte
}

// ErrFrameTooLarge reports a frame whose length exceeds the reader's bound.
var ErrFrameTooLarge = errors.New("agent protocol: frame too large")

// ErrSSHAgent reports that the peer spoke SSH: the guest agent of an image
// built before the framed protocol.
var ErrSSHAgent = errors.New("the guest agent speaks SSH: the image was built by an older vmgated")

// AppendFrame appends a frame to b.
func AppendFrame(b []byte, t FrameType, id uint32, payload []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(5+len(payload)))
	b = append(b, byte(t))
	b = binary.BigEndian.AppendUint32(b, id)
	return append(b, payload...)
}

// ReadFrame reads one frame from r into buf (grown as needed up to
// maxPayload) and returns it. A frame whose payload exceeds maxPayload is
// ErrFrameTooLarge; a stream that ends inside a frame is
// io.ErrUnexpectedEOF, one that ends between frames io.EOF.
func ReadFrame(r io.Reader, buf *[]byte, maxPayload int) (Frame, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		if string(h[:4]) == "SSH-" {
			return Frame{}, ErrSSHAgent
		}
		return Frame{}, err
	}
	if string(h[:4]) == "SSH-" {
		return Frame{}, ErrSSHAgent
	}
	n := binary.BigEndian.Uint32(h[:4])
	if n < 5 {
		return Frame{}, fmt.Errorf("agent protocol: frame length %d is shorter than its header", n)
	}
	size := int64(n) - 5
	if size > int64(maxPayload) {
		return Frame{}, fmt.Errorf("%w: %d bytes, at most %d", ErrFrameTooLarge, size, maxPayload)
	}
	if int64(cap(*buf)) < size {
		*buf = make([]byte, size)
	}
	p := (*buf)[:size]
	if _, err := io.ReadFull(r, p); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return Frame{}, err
	}
	return Frame{Type: FrameType(h[4]), ID: binary.BigEndian.Uint32(h[5:]), Payload: p}, nil
}

// EncodeUint32 is the payload of a FrameWindow.
func EncodeUint32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

// DecodeWindow decodes a FrameWindow's payload: a credit of at least one
// byte.
func DecodeWindow(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("agent protocol: window payload of %d bytes, want 4", len(p))
	}
	n := binary.BigEndian.Uint32(p)
	if n == 0 {
		return 0, errors.New("agent protocol: window of 0 bytes")
	}
	return n, nil
}

// EncodeResize is the payload of a FrameResize.
func EncodeResize(cols, rows uint32) []byte {
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, cols), rows)
}

// DecodeResize decodes a FrameResize's payload.
func DecodeResize(p []byte) (cols, rows uint32, err error) {
	if len(p) != 8 {
		return 0, 0, fmt.Errorf("agent protocol: resize payload of %d bytes, want 8", len(p))
	}
	return binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]), nil
}

// Exit is how a command ended: an exit status, or the signal that killed
// it (Signal set, an RFC 4254 style name without "SIG").
type Exit struct {
	Status     uint32
	Signal     string
	CoreDumped bool
}

// maxSignalName bounds a signal name in FrameExit and FrameSignal.
const maxSignalName = 16

// Exit encodings: a status is byte 0 and a uint32; a signal is byte 1,
// a core-dumped flag byte (0 or 1) and the name.
const (
	exitStatus = 0
	exitSignal = 1
)

// EncodeExit is the payload of a FrameExit.
func EncodeExit(e Exit) []byte {
	if e.Signal != "" {
		core := byte(0)
		if e.CoreDumped {
			core = 1
		}
		return append([]byte{exitSignal, core}, e.Signal...)
	}
	return binary.BigEndian.AppendUint32([]byte{exitStatus}, e.Status)
}

// DecodeExit decodes a FrameExit's payload.
func DecodeExit(p []byte) (Exit, error) {
	switch {
	case len(p) == 5 && p[0] == exitStatus:
		return Exit{Status: binary.BigEndian.Uint32(p[1:])}, nil
	case len(p) >= 3 && p[0] == exitSignal && p[1] <= 1:
		name := string(p[2:])
		if err := checkSignalName(name); err != nil {
			return Exit{}, err
		}
		return Exit{Signal: name, CoreDumped: p[1] == 1}, nil
	}
	return Exit{}, fmt.Errorf("agent protocol: malformed exit payload (%d bytes)", len(p))
}

// DecodeSignal decodes a FrameSignal's payload: a signal name.
func DecodeSignal(p []byte) (string, error) {
	name := string(p)
	if err := checkSignalName(name); err != nil {
		return "", err
	}
	return name, nil
}

// checkSignalName accepts 1 to maxSignalName upper-case letters and
// digits: the shape of every Linux signal name without "SIG".
func checkSignalName(name string) error {
	if name == "" || len(name) > maxSignalName {
		return fmt.Errorf("agent protocol: signal name of %d bytes", len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return fmt.Errorf("agent protocol: malformed signal name %q", name)
		}
	}
	return nil
}

// DecodeReason decodes a FrameOpenFail's payload: at most MaxReason bytes
// of UTF-8 text.
func DecodeReason(p []byte) (string, error) {
	if len(p) > MaxReason {
		return "", fmt.Errorf("agent protocol: refusal of %d bytes, at most %d", len(p), MaxReason)
	}
	if !utf8.Valid(p) {
		return "", errors.New("agent protocol: refusal is not UTF-8")
	}
	return string(p), nil
}
