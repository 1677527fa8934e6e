package agent

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/vmgate/vmgate/guest/agentproto"
)

func TestRing(t *testing.T) {
	r := ring{max: 8}
	r.write([]byte("abc"))
	r.write([]byte("defgh"))
	r.write([]byte("ij")) // wraps: the oldest two go
	got := make([]byte, r.n)
	r.copyAt(0, got)
	if string(got) != "cdefghij" {
		t.Fatalf("ring holds %q, want cdefghij", got)
	}
	r.write([]byte("0123456789")) // more than it holds at once
	got = make([]byte, r.n)
	r.copyAt(0, got)
	if string(got) != "23456789" || len(r.buf) != 8 {
		t.Fatalf("ring holds %q in %d bytes, want 23456789 in 8", got, len(r.buf))
	}
	r.drop(3)
	got = make([]byte, r.n)
	r.copyAt(0, got)
	if string(got) != "56789" {
		t.Fatalf("after a drop of 3: %q", got)
	}
}

// chunksOf reads everything from since in one call.
func chunksOf(t *testing.T, o *procOutput, since int64) ([]agentproto.OutputChunk, int64, int64) {
	t.Helper()
	c, next, dropped, err := o.read(since, 1<<40, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	return c, next, dropped
}

func TestProcOutputInterleaved(t *testing.T) {
	o := newProcOutput(1 << 10)
	o.write(agentproto.StreamStdout, []byte("out1 "))
	o.write(agentproto.StreamStdout, []byte("out2 "))
	o.write(agentproto.StreamStderr, []byte("err1 "))
	o.write(agentproto.StreamStdout, []byte("out3"))
	chunks, next, dropped := chunksOf(t, o, 0)
	want := []agentproto.OutputChunk{
		{Stream: 1, Offset: 0, Data: []byte("out1 out2 ")},
		{Stream: 2, Offset: 10, Data: []byte("err1 ")},
		{Stream: 1, Offset: 15, Data: []byte("out3")},
	}
	if !equalChunks(chunks, want) || next != 19 || dropped != 0 {
		t.Fatalf("read(0) = %v, %d, %d; want %v, 19, 0", chunks, next, dropped, want)
	}
	// From the middle of a run, at most 7 bytes: the run's tail and the
	// next run's head.
	chunks, next, _, err := o.read(7, 7, 10)
	want = []agentproto.OutputChunk{{Stream: 1, Offset: 7, Data: []byte("t2 ")}, {Stream: 2, Offset: 10, Data: []byte("err1")}}
	if err != nil || !equalChunks(chunks, want) || next != 14 {
		t.Fatalf("read(7, 7) = %v, %d, %v; want %v, 14", chunks, next, err, want)
	}
	// At most one chunk.
	if chunks, next, _, _ := o.read(0, 100, 1); len(chunks) != 1 || next != 10 {
		t.Fatalf("one chunk: %v, next %d", chunks, next)
	}
	// At the end: nothing, and next stays.
	if chunks, next, dropped := chunksOf(t, o, 19); len(chunks) != 0 || next != 19 || dropped != 0 {
		t.Fatalf("read at the end: %v, %d, %d", chunks, next, dropped)
	}
	if _, _, _, err := o.read(20, 10, 10); err == nil {
		t.Fatal("read past the end accepted")
	}
	if _, _, _, err := o.read(-1, 10, 10); err == nil {
		t.Fatal("a negative offset accepted")
	}
	// No bytes asked: nothing, next is since.
	if chunks, next, dropped, err := o.read(3, 0, 10); len(chunks) != 0 || next != 3 || dropped != 0 || err != nil {
		t.Fatalf("read of 0 bytes: %v, %d, %d, %v", chunks, next, dropped, err)
	}
}

// TestProcOutputDrops: past its bound a stream drops its oldest bytes,
// counted; the other stream keeps its own; a read from before what is
// kept reports the bytes it missed.
func TestProcOutputDrops(t *testing.T) {
	o := newProcOutput(8)
	o.write(agentproto.StreamStderr, []byte("E"))          // offset 0
	o.write(agentproto.StreamStdout, []byte("0123456789")) // offsets 1-10: 1 and 2 dropped
	o.write(agentproto.StreamStdout, []byte("ab"))         // offsets 11-12: 3 and 4 dropped
	chunks, next, dropped := chunksOf(t, o, 0)
	want := []agentproto.OutputChunk{{Stream: 2, Offset: 0, Data: []byte("E")}, {Stream: 1, Offset: 5, Data: []byte("456789ab")}}
	if !equalChunks(chunks, want) || next != 13 || dropped != 0 {
		t.Fatalf("read(0) = %v, %d, %d; want %v, 13, 0", chunks, next, dropped, want)
	}
	chunks, _, dropped = chunksOf(t, o, 2)
	if len(chunks) != 1 || chunks[0].Offset != 5 || dropped != 3 {
		t.Fatalf("read(2) = %v, dropped %d; want from 5, 3 dropped", chunks, dropped)
	}
	s := o.streams[0]
	if s.total != 12 || s.dropped() != 4 || s.ring.n != 8 {
		t.Fatalf("stdout: %d written, %d dropped, %d held", s.total, s.dropped(), s.ring.n)
	}
}

// TestProcOutputRunsBounded: a process that writes its streams in turns,
// a byte at a time, makes a run per byte; a stream keeps at most
// maxRuns of them, and its bytes past that are dropped.
func TestProcOutputRunsBounded(t *testing.T) {
	const bound = 16 << 10
	o := newProcOutput(bound)
	for i := range 100_000 {
		o.write(1+i%2, []byte{byte(i)})
	}
	for i, s := range o.streams {
		if len(s.runs) > maxRuns(bound) || s.ring.n > bound || s.total != 50_000 || s.dropped() != 50_000-int64(s.ring.n) {
			t.Errorf("stream %d: %d runs (at most %d), %d held, %d written, %d dropped", i+1, len(s.runs), maxRuns(bound), s.ring.n, s.total, s.dropped())
		}
	}
	chunks, next, dropped := chunksOf(t, o, 0)
	if next != 100_000 || len(chunks) != 2*maxRuns(bound) || dropped != chunks[0].Offset {
		t.Fatalf("%d chunks, next %d, dropped %d", len(chunks), next, dropped)
	}
}

// TestProcOutputModel: random writes of both streams against a model
// that keeps everything: what a read returns is what was written at
// those offsets, in order; each stream keeps a suffix of what it wrote,
// within its bound; reading in small steps returns what one read does.
func TestProcOutputModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 200 {
		bound := 1 + rng.IntN(300)
		o := newProcOutput(bound)
		var history []struct {
			stream int
			b      byte
		}
		var per [2][]byte
		for range rng.IntN(60) {
			stream := 1 + rng.IntN(2)
			p := make([]byte, rng.IntN(2*bound+2))
			for i := range p {
				p[i] = byte(rng.Uint32())
				history = append(history, struct {
					stream int
					b      byte
				}{stream, p[i]})
			}
			per[stream-1] = append(per[stream-1], p...)
			o.write(stream, p)
		}
		if o.next != int64(len(history)) {
			t.Fatalf("iter %d: next %d after %d bytes", iter, o.next, len(history))
		}
		since := int64(rng.IntN(len(history) + 1))
		all, next, dropped := chunksOf(t, o, since)
		var kept [2][]byte
		end := since
		for i, c := range all {
			if c.Offset < end || len(c.Data) == 0 || (i == 0 && c.Offset != since+dropped) {
				t.Fatalf("iter %d: chunk %d at %d (%d bytes) after %d; dropped %d", iter, i, c.Offset, len(c.Data), end, dropped)
			}
			for k, b := range c.Data {
				h := history[c.Offset+int64(k)]
				if h.stream != c.Stream || h.b != b {
					t.Fatalf("iter %d: byte at %d is %d of stream %d, want %d of %d", iter, c.Offset+int64(k), b, c.Stream, h.b, h.stream)
				}
			}
			kept[c.Stream-1] = append(kept[c.Stream-1], c.Data...)
			end = c.Offset + int64(len(c.Data))
		}
		if next != o.next {
			t.Fatalf("iter %d: next %d, want %d", iter, next, o.next)
		}
		if since == 0 {
			for i := range per {
				s := o.streams[i]
				if s.ring.n > bound || !bytes.Equal(kept[i], per[i][len(per[i])-s.ring.n:]) || s.total != int64(len(per[i])) {
					t.Fatalf("iter %d: stream %d keeps %d bytes (bound %d), not the suffix of what it wrote", iter, i+1, s.ring.n, bound)
				}
			}
		}
		// In steps of at most 7 bytes and 2 chunks.
		var stepped []agentproto.OutputChunk
		at := since
		for at < o.next {
			c, n, _, err := o.read(at, 7, 2)
			if err != nil {
				t.Fatal(err)
			}
			stepped = append(stepped, c...)
			if n <= at {
				t.Fatalf("iter %d: a read from %d went on at %d", iter, at, n)
			}
			at = n
		}
		if !bytes.Equal(flatten(stepped), flatten(all)) {
			t.Fatalf("iter %d: stepped reads differ from one read", iter)
		}
	}
}

// flatten is each byte of cs with its stream and offset.
func flatten(cs []agentproto.OutputChunk) []byte {
	var b []byte
	for _, c := range cs {
		for k, d := range c.Data {
			b = binary.BigEndian.AppendUint64(append(b, byte(c.Stream), d), uint64(c.Offset)+uint64(k))
		}
	}
	return b
}

func equalChunks(a, b []agentproto.OutputChunk) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Stream != b[i].Stream || a[i].Offset != b[i].Offset || !bytes.Equal(a[i].Data, b[i].Data) {
			return false
		}
	}
	return true
}
