package agent

import (
	"fmt"
	"sort"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// A background process's output (procs.go): each stream's latest bytes in
// a ring of at most the process's buffer size, and the runs that place
// them in the process's output, whose offsets count both streams in the
// order the agent read them. What a stream's ring no longer holds is
// dropped, oldest first, and counted.
//
// Memory: a ring grows with what was written, up to its bound, and never
// past it. A run costs a few words, and a process that writes its two
// streams in turns, a byte at a time, makes a run per byte: a stream
// therefore keeps at most maxRuns(bound) runs, and drops its oldest run's
// bytes past that, so that a stream's memory stays within about 1.2 times
// its bound whatever the process writes.

// runCost is a run's share of a stream's bound: a stream keeps at most
// bound/runCost runs (and at least minRuns).
const (
	runCost = 128
	minRuns = 64
)

func maxRuns(bound int) int { return max(bound/runCost, minRuns) }

// ring holds the latest bytes written to it, at most max.
type ring struct {
	buf   []byte // its capacity: grows up to max
	max   int
	start int // index in buf of the oldest byte held
	n     int // bytes held
}

// minRing is a ring's first allocation.
const minRing = 4 << 10

// write appends p, dropping the oldest bytes past max.
func (r *ring) write(p []byte) {
	if len(p) >= r.max {
		r.grow(r.max)
		copy(r.buf, p[len(p)-r.max:])
		r.start, r.n = 0, r.max
		return
	}
	if need := r.n + len(p); need > len(r.buf) {
		r.grow(min(r.max, max(2*len(r.buf), need, minRing)))
	}
	if over := r.n + len(p) - len(r.buf); over > 0 {
		r.drop(over)
	}
	at := (r.start + r.n) % len(r.buf)
	k := copy(r.buf[at:], p)
	copy(r.buf, p[k:])
	r.n += len(p)
}

// grow makes the ring's capacity size, keeping what it holds.
func (r *ring) grow(size int) {
	if size <= len(r.buf) {
		return
	}
	b := make([]byte, size)
	r.copyAt(0, b[:r.n])
	r.buf, r.start = b, 0
}

// drop forgets the k oldest bytes.
func (r *ring) drop(k int) {
	k = min(k, r.n)
	r.n -= k
	if r.n == 0 {
		r.start = 0
		return
	}
	r.start = (r.start + k) % len(r.buf)
}

// copyAt fills dst with the bytes held from index i (0: the oldest).
func (r *ring) copyAt(i int, dst []byte) {
	if len(dst) == 0 {
		return
	}
	at := (r.start + i) % len(r.buf)
	k := copy(dst, r.buf[at:])
	copy(dst[k:], r.buf)
}

// outRun is a stretch of one stream's bytes that is contiguous in the
// process's output: n bytes from stream position pos, at output offset
// off.
type outRun struct{ pos, off, n int64 }

// streamBuf is one stream's kept output.
type streamBuf struct {
	ring  ring
	runs  []outRun // oldest first; they cover exactly what the ring holds
	total int64    // bytes written in all
}

// first is the stream position of the oldest byte held.
func (s *streamBuf) first() int64 { return s.total - int64(s.ring.n) }

// dropped counts the bytes written that are no longer held.
func (s *streamBuf) dropped() int64 { return s.first() }

// procOutput is a process's output: both streams.
type procOutput struct {
	streams [2]streamBuf // stdout, stderr
	next    int64        // the offset of the next byte
	maxRuns int
}

// newProcOutput returns an empty output whose streams hold at most bound
// bytes each.
func newProcOutput(bound int) *procOutput {
	o := &procOutput{maxRuns: maxRuns(bound)}
	for i := range o.streams {
		o.streams[i].ring.max = bound
	}
	return o
}

// write appends p to stream (agentproto.StreamStdout or StreamStderr).
func (o *procOutput) write(stream int, p []byte) {
	if len(p) == 0 {
		return
	}
	s := &o.streams[stream-1]
	off, n := o.next, int64(len(p))
	o.next += n
	if k := len(s.runs) - 1; k >= 0 && s.runs[k].off+s.runs[k].n == off {
		s.runs[k].n += n // nothing of the other stream came between
	} else {
		s.runs = append(s.runs, outRun{pos: s.total, off: off, n: n})
	}
	s.total += n
	s.ring.write(p)
	s.trim()
	for len(s.runs) > o.maxRuns {
		s.ring.drop(int(s.runs[0].n))
		s.runs = s.runs[1:]
	}
}

// trim forgets the runs, or their heads, that the ring no longer holds.
func (s *streamBuf) trim() {
	first := s.first()
	for len(s.runs) > 0 && s.runs[0].pos+s.runs[0].n <= first {
		s.runs = s.runs[1:]
	}
	if len(s.runs) > 0 && s.runs[0].pos < first {
		d := first - s.runs[0].pos
		s.runs[0].pos += d
		s.runs[0].off += d
		s.runs[0].n -= d
	}
	if len(s.runs) == 0 {
		s.runs = nil // let go of the old array
	}
}

// read returns the output from offset since on: at most maxBytes bytes in
// at most maxChunks chunks, in the order written; next is the offset after
// the last byte returned (o.next when there is none), and dropped counts
// the bytes between since and the first chunk (or next) that are no longer
// held. A since past o.next is an error.
func (o *procOutput) read(since, maxBytes int64, maxChunks int) (chunks []agentproto.OutputChunk, next, dropped int64, err error) {
	if since < 0 || since > o.next {
		return nil, 0, 0, fmt.Errorf("offset %d is outside the output (0 to %d)", since, o.next)
	}
	if maxBytes <= 0 || maxChunks <= 0 {
		return nil, since, 0, nil
	}
	// The first run of each stream that ends past since.
	var idx [2]int
	for i := range o.streams {
		runs := o.streams[i].runs
		idx[i] = sort.Search(len(runs), func(k int) bool { return runs[k].off+runs[k].n > since })
	}
	left := maxBytes
	next = since
	for left > 0 && len(chunks) < maxChunks {
		i := -1 // the stream whose next run comes first
		for j := range o.streams {
			if idx[j] < len(o.streams[j].runs) && (i < 0 || o.streams[j].runs[idx[j]].off < o.streams[i].runs[idx[i]].off) {
				i = j
			}
		}
		if i < 0 {
			next = o.next // what follows is no longer held
			break
		}
		s := &o.streams[i]
		r := s.runs[idx[i]]
		from := max(r.off, since)
		k := min(r.off+r.n-from, left)
		data := make([]byte, k)
		s.ring.copyAt(int(r.pos+(from-r.off)-s.first()), data)
		chunks = append(chunks, agentproto.OutputChunk{Stream: i + 1, Offset: from, Data: data})
		left -= k
		next = from + k
		if from+k == r.off+r.n {
			idx[i]++
		}
	}
	if len(chunks) > 0 {
		dropped = chunks[0].Offset - since
	} else {
		dropped = o.next - since
	}
	return chunks, next, dropped, nil
}
