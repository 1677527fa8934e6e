package agentconn

import (
	"errors"
	"io"
	"sync"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// Channel is one command's channel. On the host, Read is the command's
// stdout (or its terminal's output), Stderr its stderr and Write its
// stdin; on the guest, Read is the stdin and Write and Stderr the output.
type Channel struct {
	c  *Conn
	id uint32

	mu   sync.Mutex
	cond sync.Cond // on mu: any change below

	in      [2][]byte // received, not yet read: data, stderr
	inEOF   bool      // no more data will arrive
	inLeft  int64     // bytes the peer may still send
	unacked int64     // bytes read and not yet granted back

	outLeft int64 // bytes this end may still send
	outEOF  bool  // this end sent EOF

	localClosed  bool
	remoteClosed bool
	gone         bool // the connection ended

	// The host's.
	opened   chan struct{} // closed at the answer to the open, or the end
	answered bool
	refused  bool
	reason   string
	exit     *agentproto.Exit
	exited   chan struct{} // closed at the exit record, or the end without one

	// The guest's: signals and resizes not yet taken.
	events []Event
}

// Event is a request of the host for a running command: a signal
// (Signal set) or a terminal size (Columns and Rows set).
type Event struct {
	Signal        string
	Columns, Rows uint32
}

// maxPendingEvents bounds the events a guest channel holds that its
// handler has not taken: a host that sends more is broken.
const maxPendingEvents = 1024

func newChannel(c *Conn, id uint32) *Channel {
	ch := &Channel{c: c, id: id, inLeft: agentproto.Window, outLeft: agentproto.Window}
	ch.cond.L = &ch.mu
	if c.host {
		ch.opened = make(chan struct{})
		ch.exited = make(chan struct{})
	}
	return ch
}

// onFrame takes one frame for this channel from the reader; a malformed
// payload is a protocol error.
func (ch *Channel) onFrame(f agentproto.Frame) error {
	err := ch.take(f)
	var pe *ProtocolError
	if err != nil && !errors.As(err, &pe) {
		err = violation("%v", err)
	}
	return err
}

func (ch *Channel) take(f agentproto.Frame) error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.remoteClosed {
		return violation("%s frame after close on channel %d", f.Type, ch.id)
	}
	if ch.c.host && !ch.answered {
		return ch.onAnswer(f)
	}
	if !ch.c.host && ch.localClosed && f.Type != agentproto.FrameClose {
		return nil // the command is over; its input no longer matters
	}
	switch f.Type {
	case agentproto.FrameData, agentproto.FrameStderr:
		return ch.onData(f)
	case agentproto.FrameEOF:
		if ch.inEOF {
			return violation("second eof on channel %d", ch.id)
		}
		ch.inEOF = true
	case agentproto.FrameWindow:
		n, err := agentproto.DecodeWindow(f.Payload)
		if err != nil {
			return err
		}
		if ch.outLeft+int64(n) > 1<<31 {
			return violation("window of channel %d grows past 2 GiB", ch.id)
		}
		ch.outLeft += int64(n)
	case agentproto.FrameExit:
		if ch.exit != nil {
			return violation("second exit on channel %d", ch.id)
		}
		e, err := agentproto.DecodeExit(f.Payload)
		if err != nil {
			return err
		}
		ch.exit = &e
		close(ch.exited)
	case agentproto.FrameSignal:
		name, err := agentproto.DecodeSignal(f.Payload)
		if err != nil {
			return err
		}
		return ch.queue(Event{Signal: name})
	case agentproto.FrameResize:
		cols, rows, err := agentproto.DecodeResize(f.Payload)
		if err != nil {
			return err
		}
		return ch.queue(Event{Columns: cols, Rows: rows})
	case agentproto.FrameClose:
		ch.remoteClosed, ch.inEOF = true, true
		ch.endExit()
		if ch.localClosed {
			ch.c.forget(ch.id)
		}
	default:
		return violation("%s frame on channel %d", f.Type, ch.id)
	}
	ch.cond.Broadcast()
	return nil
}

// onAnswer takes the guest's answer to the host's open: nothing else may
// come first.
func (ch *Channel) onAnswer(f agentproto.Frame) error {
	switch f.Type {
	case agentproto.FrameOpenOK:
		if len(f.Payload) != 0 {
			return violation("open-ok with a payload")
		}
	case agentproto.FrameOpenFail:
		reason, err := agentproto.DecodeReason(f.Payload)
		if err != nil {
			return err
		}
		ch.refused, ch.reason = true, reason
		ch.remoteClosed, ch.inEOF = true, true
		ch.endExit()
		ch.c.forget(ch.id)
	default:
		return violation("%s frame on channel %d before the answer to its open", f.Type, ch.id)
	}
	ch.answered = true
	close(ch.opened)
	ch.cond.Broadcast()
	return nil
}

// onData buffers a data frame within the window the peer was granted.
func (ch *Channel) onData(f agentproto.Frame) error {
	if ch.inEOF {
		return violation("data after eof on channel %d", ch.id)
	}
	if len(f.Payload) > agentproto.MaxData {
		return violation("data frame of %d bytes, at most %d", len(f.Payload), agentproto.MaxData)
	}
	if int64(len(f.Payload)) > ch.inLeft {
		return violation("channel %d sent past its window", ch.id)
	}
	s := 0
	if f.Type == agentproto.FrameStderr {
		s = 1
	}
	ch.inLeft -= int64(len(f.Payload))
	ch.in[s] = append(ch.in[s], f.Payload...)
	ch.cond.Broadcast()
	return nil
}

// queue adds a guest event for the handler.
func (ch *Channel) queue(e Event) error {
	if len(ch.events) >= maxPendingEvents {
		return violation("more than %d events pending on channel %d", maxPendingEvents, ch.id)
	}
	ch.events = append(ch.events, e)
	ch.cond.Broadcast()
	return nil
}

// endExit wakes the host's waiters for an exit record that will not come.
func (ch *Channel) endExit() {
	if ch.exited != nil && ch.exit == nil {
		select {
		case <-ch.exited:
		default:
			close(ch.exited)
		}
	}
}

// connGone marks the end of the connection.
func (ch *Channel) connGone() {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.gone, ch.inEOF = true, true
	if ch.opened != nil && !ch.answered {
		ch.answered = true
		close(ch.opened)
	}
	ch.endExit()
	ch.cond.Broadcast()
}

// Read reads the main stream: stdout on the host, stdin on the guest. It
// returns io.EOF once the peer sent EOF (or closed, or the connection
// ended) and everything before it was read.
func (ch *Channel) Read(p []byte) (int, error) { return ch.read(0, p) }

// Write writes the main stream: stdin on the host, stdout on the guest.
// It blocks while the peer's window is exhausted.
func (ch *Channel) Write(p []byte) (int, error) { return ch.write(agentproto.FrameData, p) }

// Stderr is the command's stderr: read on the host, written on the guest.
func (ch *Channel) Stderr() io.ReadWriter { return stderr{ch} }

type stderr struct{ ch *Channel }

func (s stderr) Read(p []byte) (int, error)  { return s.ch.read(1, p) }
func (s stderr) Write(p []byte) (int, error) { return s.ch.write(agentproto.FrameStderr, p) }

func (ch *Channel) read(s int, p []byte) (int, error) {
	ch.mu.Lock()
	for len(ch.in[s]) == 0 && !ch.inEOF && !ch.localClosed {
		ch.cond.Wait()
	}
	if len(ch.in[s]) == 0 {
		ch.mu.Unlock()
		return 0, io.EOF
	}
	n := copy(p, ch.in[s])
	ch.in[s] = ch.in[s][n:]
	if len(ch.in[s]) == 0 {
		ch.in[s] = nil
	}
	ch.unacked += int64(n)
	var grant int64
	if ch.unacked >= agentproto.Window/2 && !ch.inEOF {
		grant, ch.unacked = ch.unacked, 0
		ch.inLeft += grant
	}
	ch.mu.Unlock()
	if grant > 0 {
		_ = ch.c.writeFrame(agentproto.FrameWindow, ch.id, agentproto.EncodeUint32(uint32(grant)))
	}
	return n, nil
}

// errWriteClosed reports a write after this end closed the channel or
// sent EOF.
var errWriteClosed = errors.New("agent channel: write after close")

func (ch *Channel) write(t agentproto.FrameType, p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		ch.mu.Lock()
		for ch.outLeft == 0 && ch.sendErr(true) == nil {
			ch.cond.Wait()
		}
		if err := ch.sendErr(true); err != nil {
			ch.mu.Unlock()
			return n, err
		}
		k := min(int64(len(p)), agentproto.MaxData, ch.outLeft)
		ch.outLeft -= k
		ch.mu.Unlock()
		if err := ch.c.writeFrame(t, ch.id, p[:k]); err != nil {
			return n, err
		}
		n += int(k)
		p = p[k:]
	}
	return n, nil
}

// sendErr says why nothing more can be sent (data: data or EOF), or nil.
func (ch *Channel) sendErr(data bool) error {
	switch {
	case ch.gone:
		return ch.c.Err()
	case ch.localClosed || data && ch.outEOF:
		return errWriteClosed
	case ch.remoteClosed:
		return io.EOF
	}
	return nil
}

// control sends a frame that is not counted in the window, unless the
// channel is over at either end.
func (ch *Channel) control(t agentproto.FrameType, payload []byte) error {
	ch.mu.Lock()
	err := ch.sendErr(t == agentproto.FrameEOF)
	if t == agentproto.FrameEOF && err == nil {
		ch.outEOF = true
		ch.cond.Broadcast()
	}
	ch.mu.Unlock()
	if err != nil {
		return err
	}
	return ch.c.writeFrame(t, ch.id, payload)
}

// CloseWrite sends EOF: no more stdin (host), no more output (guest).
func (ch *Channel) CloseWrite() error { return ch.control(agentproto.FrameEOF, nil) }

// Close ends this end of the channel: reads return io.EOF, writes fail.
// The host's close kills a command that still runs; the guest closes
// after the exit record. The channel is forgotten once both ends closed
// (on the host, at once: what the guest sends after is dropped).
func (ch *Channel) Close() error {
	ch.mu.Lock()
	if ch.localClosed {
		ch.mu.Unlock()
		return nil
	}
	ch.localClosed = true
	send := !ch.gone && !ch.refused
	if ch.opened != nil && !ch.answered {
		ch.answered = true
		close(ch.opened)
	}
	ch.endExit()
	forget := ch.c.host || ch.remoteClosed
	ch.cond.Broadcast()
	ch.mu.Unlock()
	if forget {
		ch.c.forget(ch.id)
	}
	if send {
		return ch.c.writeFrame(agentproto.FrameClose, ch.id, nil)
	}
	return nil
}
