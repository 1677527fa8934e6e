package client

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestParsePublish(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, c := range []struct {
		in   string
		want PublishSpec
	}{
		{"8080:8000", PublishSpec{Addr: ap("127.0.0.1:8080"), GuestPort: 8000}},
		{"0:8000", PublishSpec{Addr: ap("127.0.0.1:0"), GuestPort: 8000}},
		{"127.0.0.2:8080:80", PublishSpec{Addr: ap("127.0.0.2:8080"), GuestPort: 80}},
		{"localhost:8080:80", PublishSpec{Addr: ap("127.0.0.1:8080"), GuestPort: 80}},
		{"0.0.0.0:80:80", PublishSpec{Addr: ap("0.0.0.0:80"), GuestPort: 80}},
		{"[::1]:8080:8000", PublishSpec{Addr: ap("[::1]:8080"), GuestPort: 8000}},
		{"[::]:65535:65535", PublishSpec{Addr: ap("[::]:65535"), GuestPort: 65535}},
		{"/tmp/app.sock:8000", PublishSpec{Unix: "/tmp/app.sock", GuestPort: 8000}},
		{"./app.sock:1", PublishSpec{Unix: "./app.sock", GuestPort: 1}},
		{"/tmp/a:b.sock:8000", PublishSpec{Unix: "/tmp/a:b.sock", GuestPort: 8000}},
		{"08080:08000", PublishSpec{Addr: ap("127.0.0.1:8080"), GuestPort: 8000}},
	} {
		got, err := ParsePublish(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParsePublish(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
			continue
		}
		if again, err := ParsePublish(got.String()); err != nil || again != got {
			t.Errorf("%q: its String %q parses as %+v, %v", c.in, got.String(), again, err)
		}
	}
	for _, in := range []string{
		"", "8000", ":8000", "8080:", "8080:0", "8080:65536", "65536:80", "-1:80", "+80:80", "0x50:80",
		"8080:8000x", "a:8080:8000", "example.com:8080:8000", "::1:8080:8000", "[::1:8080:8000", "[127.0.0.1]:80:80",
		"[fe80::1%eth0]:80:80", "1.2.3.4:5:6:7", " 8080:8000", "8080 :8000", "/tmp/:8000", "/tmp/a\x00b:80",
		"/" + strings.Repeat("a", 107) + ":80", "123456:80",
	} {
		if got, err := ParsePublish(in); err == nil {
			t.Errorf("ParsePublish(%q) = %+v, want an error", in, got)
		} else if !strings.Contains(err.Error(), "--publish") {
			t.Errorf("ParsePublish(%q): the error %q does not name the flag", in, err)
		}
	}
}

func FuzzParsePublish(f *testing.F) {
	for _, s := range []string{"8080:8000", "[::1]:0:1", "/tmp/x.sock:80", "localhost:1:2", "a:b:c:d", "[::ffff:1.2.3.4]:5:6"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		spec, err := ParsePublish(s)
		if err != nil {
			return
		}
		if spec.GuestPort == 0 || (spec.Unix == "") == !spec.Addr.IsValid() {
			t.Fatalf("%q parsed as %+v", s, spec)
		}
		if spec.Unix != "" && (len(spec.Unix) > maxUnixPath || !strings.Contains(spec.Unix, "/") || strings.IndexByte(spec.Unix, 0) >= 0) {
			t.Fatalf("%q: socket path %q", s, spec.Unix)
		}
		if again, err := ParsePublish(spec.String()); err != nil || again != spec {
			t.Fatalf("%q: String %q parses as %+v, %v", s, spec.String(), again, err)
		}
	})
}

// TestListen: a busy TCP address is an error that names it; a Unix socket
// is made 0600, replaces a stale one, refuses a live one or another file,
// and goes with Close.
func TestListen(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	spec, _ := ParsePublish(busy.Addr().String() + ":80")
	if _, err := spec.Listen(); err == nil || !strings.Contains(err.Error(), busy.Addr().String()) || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a busy address: %v", err)
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "app.sock")
	s := PublishSpec{Unix: path, GuestPort: 80}
	h, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket file: %v %v", fi, err)
	}
	if _, err := s.Listen(); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("a live socket: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file after Close: %v", err)
	}

	// A socket nobody listens on any more (its forward was killed).
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()
	if _, err := net.Dial("unix", path); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("stale socket: %v", err)
	}
	h, err = s.Listen()
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	h.Close()

	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := (PublishSpec{Unix: file, GuestPort: 80}).Listen(); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("over a regular file: %v", err)
	}
}
