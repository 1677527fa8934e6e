package sshfront

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

func TestParseSSHListen(t *testing.T) {
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
		got, err := parseListen(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("parseListen(%q) = %+v, %v; want error ~%q", tt.in, got, err, tt.err)
			}
			continue
		}
		if err != nil || got.network != tt.network || got.addr != tt.addr || got.loopback != tt.loopback {
			t.Errorf("parseListen(%q) = %+v, %v; want {%s %s %v}", tt.in, got, err, tt.network, tt.addr, tt.loopback)
		}
	}
}

func FuzzParseSSHListen(f *testing.F) {
	for _, s := range []string{"127.0.0.1:2222", "[::1]:22", "[::ffff:127.0.0.1]:1", "0.0.0.0:0", "unix:/run/x.sock",
		"unix:", ":22", "localhost:22", "[fe80::1%lo]:22", "1.2.3.4:99999", "unix:/a/../b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseListen(s)
		if err != nil {
			return
		}
		// What parses is canonical: parsing it again gives the same.
		again := a.addr
		if a.network == "unix" {
			again = "unix:" + a.addr
		}
		b, err := parseListen(again)
		if err != nil || b != a {
			t.Fatalf("%q parsed to %+v, which parses to %+v, %v", s, a, b, err)
		}
		if a.network == "tcp" {
			host, _, _ := net.SplitHostPort(a.addr)
			ip, err := netip.ParseAddr(host)
			if err != nil || ip.IsLoopback() != a.loopback {
				t.Fatalf("%q: loopback %v for %s", s, a.loopback, host)
			}
		}
	})
}

func TestRefusal(t *testing.T) {
	tests := []struct {
		e    wire.Error
		code int
		msg  string
	}{
		{wire.Error{Code: wire.CodeDenied, Error: "shell strings are not allowed", Profile: "narrow", RequestID: "r1"}, wire.ExitDenied,
			"denied by policy profile narrow: shell strings are not allowed (request r1)"},
		{wire.Error{Code: wire.CodeDenied, Error: "argv matches deny rule", Profile: "p", Rule: "deny[0] no-rm"}, wire.ExitDenied,
			"denied by policy profile p: rule deny[0] no-rm: argv matches deny rule"},
		{wire.Error{Code: wire.CodeBusy, Error: "busy: no VM slot"}, wire.ExitBusy, "gateway busy: busy: no VM slot"},
		{wire.Error{Code: wire.CodeVM, Error: "start vm: boom"}, wire.ExitVMFailed, "start vm: boom"},
		{wire.Error{Code: wire.CodeAudit, Error: "refusing to run unaudited"}, wire.ExitInternal, "refusing to run unaudited"},
		{wire.Error{Code: wire.CodeShutdown, Error: "stopping"}, wire.ExitInternal, "stopping"},
		{wire.Error{Code: wire.CodeBadRequest, Error: "named sessions are for local callers"}, wire.ExitDenied, "named sessions are for local callers"},
	}
	for _, tt := range tests {
		code, msg := refusal(tt.e)
		if code != tt.code || msg != tt.msg {
			t.Errorf("refusal(%+v) = %d %q, want %d %q", tt.e, code, msg, tt.code, tt.msg)
		}
	}
}

func TestActivityWatch(t *testing.T) {
	a := &activity{}
	a.touch()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var fired atomic.Int32
	go a.watch(ctx, 200*time.Millisecond, func() { fired.Add(1) })
	for range 6 {
		time.Sleep(60 * time.Millisecond)
		a.touch()
	}
	if fired.Load() != 0 {
		t.Fatal("idle fired while there was traffic")
	}
	time.Sleep(500 * time.Millisecond)
	if fired.Load() != 1 {
		t.Fatalf("idle fired %d times, want once", fired.Load())
	}
}

func TestSessionFromLogin(t *testing.T) {
	tests := []struct {
		user, session string
		bad           bool
	}{
		{"agent", "", false},
		{"root", "", false},
		{"session-work", "work", false},
		{"session-a.b_c-1", "a.b_c-1", false},
		{"session-" + strings.Repeat("x", 64), strings.Repeat("x", 64), false},
		{"session-" + strings.Repeat("x", 65), "", true},
		{"session-", "", true},
		{"session-..", "", true},
		{"session-.", "", true},
		{"session-a/b", "", true},
		{"session-a b", "", true},
		{"session-ä", "", true},
		{"session-a\x00", "", true},
	}
	for _, tt := range tests {
		got, err := SessionFromLogin(tt.user)
		if got != tt.session || (err != nil) != tt.bad {
			t.Errorf("SessionFromLogin(%q) = %q, %v; want %q, error %v", tt.user, got, err, tt.session, tt.bad)
		}
	}
}
