// Package relay copies the bytes of two connections both ways: a host
// client's connection into a published session port and the connection
// into the guest that carries it (package gateway, and the netstack's end
// in vm/netproc). It reads and writes with plain calls and a buffer of its
// own (no splice or sendfile), so that a seccomp allowlist of read and
// write covers it.
package relay

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// bufSize is the buffer of each direction.
const bufSize = 32 << 10

// Linger is how long the one direction left may be idle once the other
// has ended: a peer that keeps its side open and silent after the other
// half-closed (a guest that never closes a forwarded connection) holds
// the relay, and what it counts against, no longer than this.
const Linger = 30 * time.Second

// Conns copies a to b and b to a until both directions have ended, and
// returns the bytes copied each way. A direction ends at its reader's EOF
// (its writer is then half-closed, CloseWrite, so that the other side
// sees the end and may still answer), at an error, or, once the other
// has ended, when it has been idle for Linger; an error ends both
// directions, as the connection is broken. Closing a or b from elsewhere
// ends the relay. Conns does not close a or b: the caller does.
func Conns(a, b net.Conn) (aToB, bToA int64) {
	r := With(a, b, Options{})
	return r.AToB, r.BToA
}

// Options are a relay's bounds and hooks beyond Conns'.
type Options struct {
	// Idle ends the relay once no byte has moved either way for this
	// long (0: never), as an error would: both directions at once.
	Idle time.Duration
	// Active, when set, is called when bytes move, at most once per
	// activeEvery (from the relay's goroutines).
	Active func()
}

// activeEvery is how often Options.Active is called at most.
const activeEvery = time.Second

// Result is how a relay went: the bytes copied each way, and whether
// Options.Idle ended it.
type Result struct {
	AToB, BToA int64
	Idle       bool
}

// With is Conns with o's bounds and hooks.
func With(a, b net.Conn, o Options) Result { return relay(a, b, Linger, o) }

func conns(a, b net.Conn, linger time.Duration) (aToB, bToA int64) {
	r := relay(a, b, linger, Options{})
	return r.AToB, r.BToA
}

// state is what the two directions of one relay share.
type state struct {
	linger time.Duration
	o      Options
	ended  atomic.Bool  // a direction has ended
	idle   atomic.Bool  // Options.Idle ended the relay
	last   atomic.Int64 // when bytes last moved (unix ns)
	told   atomic.Int64 // when Active was last called (unix ns)
}

func relay(a, b net.Conn, linger time.Duration, o Options) Result {
	st := &state{linger: linger, o: o}
	st.last.Store(time.Now().UnixNano())
	var r Result
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.BToA = st.half(a, b)
		st.ended.Store(true)
		_ = a.SetReadDeadline(time.Now().Add(linger)) // the other direction's reader
	}()
	r.AToB = st.half(b, a)
	st.ended.Store(true)
	_ = b.SetReadDeadline(time.Now().Add(linger))
	wg.Wait()
	r.Idle = st.idle.Load()
	return r
}

// moved records that bytes moved now.
func (st *state) moved() {
	now := time.Now().UnixNano()
	st.last.Store(now)
	if prev := st.told.Load(); st.o.Active != nil && now-prev >= int64(activeEvery) && st.told.CompareAndSwap(prev, now) {
		st.o.Active()
	}
}

// deadline is when a read of src gives up: once the other direction has
// ended, linger from now; with an idle bound, idle after the last bytes
// moved either way; whichever comes first (zero: never).
func (st *state) deadline() time.Time {
	var d time.Time
	if st.ended.Load() {
		d = time.Now().Add(st.linger)
	}
	if st.o.Idle > 0 {
		if i := time.Unix(0, st.last.Load()).Add(st.o.Idle); d.IsZero() || i.Before(d) {
			d = i
		}
	}
	return d
}

// half copies src to dst. At src's EOF dst is half-closed; on an error
// (or a dst that cannot be half-closed) both are closed, which ends the
// other direction too. Once the other direction has ended, each read may
// wait the linger at most; with an idle bound, a read that times out
// while the other direction moved bytes within it goes on.
func (st *state) half(dst, src net.Conn) int64 {
	buf := make([]byte, bufSize)
	var n int64
	for {
		_ = src.SetReadDeadline(st.deadline())
		k, rerr := src.Read(buf)
		if k > 0 {
			st.moved()
			w, werr := dst.Write(buf[:k])
			n += int64(w)
			if werr != nil {
				dst.Close()
				src.Close()
				return n
			}
		}
		if rerr != nil {
			if errors.Is(rerr, os.ErrDeadlineExceeded) && st.o.Idle > 0 && !st.ended.Load() {
				if time.Since(time.Unix(0, st.last.Load())) < st.o.Idle {
					continue // the other direction kept it alive
				}
				st.idle.Store(true)
			}
			if errors.Is(rerr, io.EOF) {
				if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
					return n
				}
			}
			dst.Close()
			src.Close()
			return n
		}
	}
}
