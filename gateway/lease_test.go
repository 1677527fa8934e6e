package gateway

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"
)

// TestShutdownBoundsStuckRequests: a request that does not end when the
// grace period is over and it is killed (a close that waits in the
// kernel, say) does not hold the stop: once stuckAfterKill has passed too,
// the stop goes on to pause the sessions.
func TestShutdownBoundsStuckRequests(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	s := &Server{cfg: Config{Grace: 200 * time.Millisecond}, log: log, flight: newInflight()}
	s.sessions = &sessions{log: log, table: map[sessionKey]*session{}, grace: s.cfg.Grace}
	l, rerr := s.enter(context.Background())
	if rerr != nil {
		t.Fatal(rerr)
	}
	defer l.end() // never before the stop: it is stuck
	done := make(chan struct{})
	t0 := time.Now()
	go func() {
		s.shutdown(&http.Server{})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(s.cfg.Grace + stuckAfterKill + 5*time.Second):
		t.Fatal("the stop waits on a request that does not end")
	}
	if d := time.Since(t0); d < s.cfg.Grace+stuckAfterKill {
		t.Errorf("the stop went on after %v, before the grace period and the wait for killed requests", d)
	}
	if l.ctx.Err() == nil {
		t.Error("the stuck request's context was not ended")
	}
	if _, rerr := s.enter(context.Background()); rerr == nil || rerr.Kind != ErrShutdown {
		t.Errorf("a request after the stop: %v", rerr)
	}
}
