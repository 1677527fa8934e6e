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
func Conns(a, b net.Conn) (aToB, bToA int64) { return conns(a, b, Linger) }

func conns(a, b net.Conn, linger time.Duration) (aToB, bToA int64) {
	var ended atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		bToA = half(a, b, &ended, linger)
		ended.Store(true)
		_ = a.SetReadDeadline(time.Now().Add(linger)) // the other direction's reader
	}()
	aToB = half(b, a, &ended, linger)
	ended.Store(true)
	_ = b.SetReadDeadline(time.Now().Add(linger))
	wg.Wait()
	return aToB, bToA
}

// half copies src to dst. At src's EOF dst is half-closed; on an error
// (or a dst that cannot be half-closed) both are closed, which ends the
// other direction too. Once the other direction has ended (ended), each
// read may wait linger at most.
func half(dst, src net.Conn, ended *atomic.Bool, linger time.Duration) int64 {
	buf := make([]byte, bufSize)
	var n int64
	for {
		if ended.Load() {
			_ = src.SetReadDeadline(time.Now().Add(linger))
		}
		k, rerr := src.Read(buf)
		if k > 0 {
			w, werr := dst.Write(buf[:k])
			n += int64(w)
			if werr != nil {
				dst.Close()
				src.Close()
				return n
			}
		}
		if rerr != nil {
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
