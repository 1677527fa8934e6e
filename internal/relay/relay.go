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
)

// bufSize is the buffer of each direction.
const bufSize = 32 << 10

// Conns copies a to b and b to a until both directions have ended, and
// returns the bytes copied each way. A direction ends at its reader's EOF
// (its writer is then half-closed, CloseWrite, so that the other side
// sees the end and may still answer) or at an error; an error ends both
// directions, as the connection is broken. Closing a or b from elsewhere
// ends the relay. Conns does not close a or b: the caller does.
func Conns(a, b net.Conn) (aToB, bToA int64) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		bToA = half(a, b)
	}()
	aToB = half(b, a)
	wg.Wait()
	return aToB, bToA
}

// half copies src to dst. At src's EOF dst is half-closed; on an error
// (or a dst that cannot be half-closed) both are closed, which ends the
// other direction too.
func half(dst, src net.Conn) int64 {
	buf := make([]byte, bufSize)
	var n int64
	for {
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
