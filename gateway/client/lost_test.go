package client

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"
)

// TestRequestLostIsUnreachable: a daemon that takes a plain request and
// goes away before its answer (killed in the middle of a pause or a
// fork) leaves the request's outcome unknown, as a daemon that cannot be
// reached does: both are an *UnreachableError (vm-exec's exit 204, "is
// vmgated running?"), not an internal error. A caller that gives up (its
// ctx ends) is told that instead.
func TestRequestLostIsUnreachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "gw.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	hold := make(chan struct{})
	defer close(hold)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				req, err := http.ReadRequest(bufio.NewReader(conn))
				if err == nil && req.URL.Path == "/v1/sessions/slow/pause" {
					<-hold // a daemon that never answers
				}
			}()
		}
	}()
	c := New(sock)
	ctx := context.Background()
	_, perr := c.PauseSession(ctx, "s")
	_, ferr := c.ForkSession(ctx, "s", []string{"a", "b"})
	var ue *UnreachableError
	for what, err := range map[string]error{"pause": perr, "fork": ferr, "end": c.EndSession(ctx, "s")} {
		if !errors.As(err, &ue) || !errors.Is(err, errConnLost) {
			t.Errorf("%s, the daemon gone before its answer: %v (%T), want an *UnreachableError", what, err, errors.Unwrap(err))
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.PauseSession(cctx, "slow"); errors.As(err, &ue) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a caller that gave up: %v, want its deadline", err)
	}
}
