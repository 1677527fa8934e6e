package vm

import (
	"bytes"
	"errors"
	"net"
)

// sshBanner starts the agent's SSH version line.
var sshBanner = []byte("SSH-2.0-")

// maxBannerSkip bounds the bytes discarded before the banner.
const maxBannerSkip = 1 << 20

// bannerConn discards whatever arrives before the agent's SSH version line.
// A VM restored from a template may deliver bytes its agent wrote to the
// template's last host connection (they sat in the virtio-serial queue
// when the state was saved) before the new connection's banner.
type bannerConn struct {
	net.Conn
	found   bool
	pending []byte // data from the banner on, not yet returned
	skipped int
}

func (c *bannerConn) Read(p []byte) (int, error) {
	if c.found {
		if len(c.pending) > 0 {
			n := copy(p, c.pending)
			c.pending = c.pending[n:]
			return n, nil
		}
		return c.Conn.Read(p)
	}
	buf := make([]byte, 4096)
	var acc []byte
	for {
		n, err := c.Conn.Read(buf)
		acc = append(acc, buf[:n]...)
		if i := bytes.Index(acc, sshBanner); i >= 0 {
			c.skipped += i
			c.found, c.pending = true, acc[i:]
			return c.Read(p)
		}
		// Keep a possible partial banner at the end.
		if keep := len(sshBanner) - 1; len(acc) > keep {
			c.skipped += len(acc) - keep
			acc = append([]byte(nil), acc[len(acc)-keep:]...)
		}
		if c.skipped > maxBannerSkip {
			return 0, errors.New("agent: no SSH banner within 1 MiB")
		}
		if err != nil {
			return 0, err
		}
	}
}
