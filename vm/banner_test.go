package vm

import (
	"io"
	"net"
	"strings"
	"testing"
)

func TestBannerConn(t *testing.T) {
	cases := []struct{ in, want string }{
		{"SSH-2.0-agent\r\nrest", "SSH-2.0-agent\r\nrest"},
		{"\x00\x00stale\x15bytesSSH-2.0-agent\r\n", "SSH-2.0-agent\r\n"},
		{strings.Repeat("x", 10000) + "SSH-2.0-a\r\n", "SSH-2.0-a\r\n"},
		{"SSH-2.SSH-2.0-b\r\n", "SSH-2.0-b\r\n"},
	}
	for _, c := range cases {
		for _, chunk := range []int{1, 3, 4096} {
			a, b := net.Pipe()
			go func() {
				for s := c.in; len(s) > 0; {
					n := min(chunk, len(s))
					_, _ = a.Write([]byte(s[:n]))
					s = s[n:]
				}
				a.Close()
			}()
			got, err := io.ReadAll(&bannerConn{Conn: b})
			if err != nil || string(got) != c.want {
				t.Errorf("%.20q in chunks of %d: got %q, %v", c.in, chunk, got, err)
			}
		}
	}
	// No banner at all: EOF, nothing returned.
	a, b := net.Pipe()
	go func() { _, _ = a.Write([]byte("garbage only")); a.Close() }()
	if got, err := io.ReadAll(&bannerConn{Conn: b}); len(got) != 0 || err != nil {
		t.Errorf("no banner: %q %v", got, err)
	}
}
