package netwire

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFrames(t *testing.T) {
	f1 := bytes.Repeat([]byte{1}, 60)
	f2 := bytes.Repeat([]byte{2}, 1514)
	stream := AppendFrame(AppendFrame(nil, f1), f2)
	r := bytes.NewReader(stream)
	buf := make([]byte, MaxFrame)
	for _, want := range [][]byte{f1, f2} {
		got, err := ReadFrame(r, buf)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("got %d bytes, %v", len(got), err)
		}
	}
	if _, err := ReadFrame(r, buf); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
	for name, in := range map[string][]byte{
		"too short": AppendFrame(nil, make([]byte, 5)),
		"too long":  {0, 2, 0, 0},
		"truncated": AppendFrame(nil, f1)[:30],
	} {
		_, err := ReadFrame(bytes.NewReader(in), buf)
		if err == nil || (name != "truncated" && !errors.Is(err, ErrFrameSize)) || (name == "truncated" && err != io.ErrUnexpectedEOF) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, make([]byte, 60)))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		buf := make([]byte, MaxFrame)
		r := bytes.NewReader(b)
		for {
			fr, err := ReadFrame(r, buf)
			if err != nil {
				return
			}
			if len(fr) < 14 || len(fr) > MaxFrame {
				t.Fatalf("frame of %d bytes", len(fr))
			}
		}
	})
}
