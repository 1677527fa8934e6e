package sshfront

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

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
