package netwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// MaxFrame bounds an Ethernet frame on QEMU's stream netdev (MTU 1500
// plus headers; virtio-net may send up to 64 KiB with offloads, which
// the NIC does not enable).
const MaxFrame = 65536

// ErrFrameSize is a frame length outside 14..MaxFrame: the peer is not
// speaking the stream protocol (or is hostile); drop the connection.
var ErrFrameSize = errors.New("netstack: bad frame length")

// ReadFrame reads one frame of QEMU's stream netdev (a 4-byte big-endian
// length, then the Ethernet frame) into buf, which must hold MaxFrame
// bytes, and returns it.
func ReadFrame(r io.Reader, buf []byte) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n < 14 || n > MaxFrame || int(n) > len(buf) {
		return nil, fmt.Errorf("%w: %d", ErrFrameSize, n)
	}
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf[:n], nil
}

// AppendFrame appends frame with its length prefix to dst.
func AppendFrame(dst, frame []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(frame)))
	return append(dst, frame...)
}
