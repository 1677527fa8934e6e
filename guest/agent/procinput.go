package agent

import (
	"os"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// inputQueue is a background process's input: the host's ProcInput data
// queued (at most agentproto.MaxInputChunk bytes that the process has not
// read yet) for one goroutine that writes it to the process's pipe, so
// that a process that does not read its input never holds a call.
type inputQueue struct {
	w    *os.File
	wake chan struct{} // cap 1: there is work for the writer

	mu      sync.Mutex
	buf     []byte // queued, not yet taken by the writer
	pending int    // queued and in the writer's hands
	eof     bool   // close the pipe after what is queued
	closed  bool   // the pipe is closed, or is being closed
	room    chan struct{}
}

// newInputQueue starts the writer of w.
func newInputQueue(w *os.File) *inputQueue {
	q := &inputQueue{w: w, wake: make(chan struct{}, 1), room: make(chan struct{})}
	go q.run()
	return q
}

// open reports whether more input may come.
func (q *inputQueue) open() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.closed && !q.eof
}

// put queues data and, with eof, the end of the input. It waits at most
// wait for the process to read enough of what is queued; then nothing of
// data is taken (ProcErrBusy).
func (q *inputQueue) put(data []byte, eof bool, wait time.Duration) error {
	var timeout <-chan time.Time
	q.mu.Lock()
	for {
		if q.closed || q.eof {
			q.mu.Unlock()
			return procErr(agentproto.ProcErrEnded, "its input is closed")
		}
		if q.pending+len(data) <= agentproto.MaxInputChunk {
			break
		}
		if timeout == nil {
			t := time.NewTimer(wait)
			defer t.Stop()
			timeout = t.C
		}
		room, pending := q.room, q.pending
		q.mu.Unlock()
		select {
		case <-room:
		case <-timeout:
			return procErr(agentproto.ProcErrBusy, "it has not read %d bytes of its input", pending)
		}
		q.mu.Lock()
	}
	q.buf = append(q.buf, data...)
	q.pending += len(data)
	q.eof = eof
	q.mu.Unlock()
	q.poke()
	return nil
}

func (q *inputQueue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// freed wakes the callers waiting for room. Called with q.mu held.
func (q *inputQueue) freed() {
	close(q.room)
	q.room = make(chan struct{})
}

// run writes what is queued until the input ends, the pipe breaks (the
// process is gone) or close.
func (q *inputQueue) run() {
	defer q.w.Close()
	for {
		q.mu.Lock()
		for len(q.buf) == 0 && !q.eof && !q.closed {
			q.mu.Unlock()
			<-q.wake
			q.mu.Lock()
		}
		if q.closed {
			q.mu.Unlock()
			return
		}
		b := q.buf
		q.buf = nil
		q.mu.Unlock()
		_, err := q.w.Write(b)
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return
		}
		q.pending -= len(b)
		q.freed()
		if err != nil || (q.eof && len(q.buf) == 0) {
			q.closed, q.buf, q.pending = true, nil, 0
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
	}
}

// close ends the input: what is queued is dropped, and a write in
// progress fails.
func (q *inputQueue) close() {
	q.mu.Lock()
	if !q.closed {
		q.closed, q.buf, q.pending = true, nil, 0
		q.freed()
	}
	q.mu.Unlock()
	_ = q.w.SetWriteDeadline(time.Unix(1, 0))
	q.poke()
}
