package listenaddr

import (
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in       string
		network  string
		addr     string
		loopback bool
		err      string
	}{
		{"127.0.0.1:2222", "tcp", "127.0.0.1:2222", true, ""},
		{"127.1.2.3:22", "tcp", "127.1.2.3:22", true, ""},
		{"[::1]:2222", "tcp", "[::1]:2222", true, ""},
		{"[::ffff:127.0.0.1]:2222", "tcp", "127.0.0.1:2222", true, ""},
		{"127.0.0.1:0", "tcp", "127.0.0.1:0", true, ""},
		{"0.0.0.0:2222", "tcp", "0.0.0.0:2222", false, ""},
		{"[::]:2222", "tcp", "[::]:2222", false, ""},
		{"192.0.2.10:2222", "tcp", "192.0.2.10:2222", false, ""},
		{"unix:/run/vmgate/ssh.sock", "unix", "/run/vmgate/ssh.sock", true, ""},

		{":2222", "", "", false, "no address"},
		{"localhost:2222", "", "", false, "not an IP address"},
		{"[fe80::1%eth0]:22", "", "", false, "not an IP address without zone"},
		{"127.0.0.1", "", "", false, "want IP:PORT"},
		{"127.0.0.1:ssh", "", "", false, "want a number"},
		{"127.0.0.1:65536", "", "", false, "want a number"},
		{"127.0.0.1:+22", "", "", false, "want a number"},
		{"127.0.0.1:022", "", "", false, "want a number"},
		{"unix:relative.sock", "", "", false, "ABSOLUTE"},
		{"unix:/a/../b.sock", "", "", false, "CLEAN"},
		{"unix:/" + strings.Repeat("a", 120), "", "", false, "too long"},
		{"", "", "", false, "want IP:PORT"},
	}
	for _, tt := range tests {
		got, err := Parse("ssh", tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("Parse(%q) = %+v, %v; want error ~%q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got.Network != tt.network || got.Addr != tt.addr || got.Loopback != tt.loopback {
			t.Errorf("Parse(%q) = %+v, %v; want {%s %s %v}", tt.in, got, err, tt.network, tt.addr, tt.loopback)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"127.0.0.1:2222", "[::1]:22", "[::ffff:127.0.0.1]:1", "0.0.0.0:0", "unix:/run/x.sock",
		"unix:", ":22", "localhost:22", "[fe80::1%lo]:22", "1.2.3.4:99999", "unix:/a/../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := Parse("ssh", s)
		if err != nil {
			return
		}
		// What parses is canonical: parsing it again gives the same.
		again := a.Addr
		if a.Network == "unix" {
			again = "unix:" + a.Addr
		}
		b, err := Parse("ssh", again)
		if err != nil || b != a {
			t.Fatalf("%q parsed to %+v, which parses to %+v, %v", s, a, b, err)
		}
		if a.Network == "tcp" {
			host, _, _ := net.SplitHostPort(a.Addr)
			ip, err := netip.ParseAddr(host)
			if err != nil || ip.IsLoopback() != a.Loopback {
				t.Fatalf("%q: loopback %v for %s", s, a.Loopback, host)
			}
		}
	})
}
