package gateway

// The one way in. Every request of any kind (a command, a session
// operation, a publication, the destruction of a fresh VM after its
// answer) holds a lease while it is in flight: a shutdown refuses new
// leases, waits for the ones held for the grace period, then ends their
// contexts, and waits for them to be given back.

import (
	"context"
	"sync"
)

// inflight counts the leases held, and carries the shutdown: stopping
// refuses new ones, and the end of the grace period (kill) ends the
// contexts of those held.
type inflight struct {
	mu       sync.Mutex
	active   int
	stopping bool
	idle     chan struct{} // closed when stopping and active reaches 0
	stopped  chan struct{} // closed when shutdown starts

	// grace ends when the grace period after shutdown is over (kill).
	grace context.Context
	kill  context.CancelFunc
}

func newInflight() *inflight {
	g := &inflight{idle: make(chan struct{}), stopped: make(chan struct{})}
	g.grace, g.kill = context.WithCancel(context.Background())
	return g
}

// lease is one request in flight. Its holder gives it back once (end).
type lease struct {
	// ctx is the request's: it ends when the context it was entered
	// with ends, when the shutdown grace period is over, or at end.
	ctx    context.Context
	cancel func()
	g      *inflight
	once   sync.Once
}

// enter takes a lease for a request whose caller's context is ctx; it
// fails (ErrShutdown) once shutdown began.
func (g *inflight) enter(ctx context.Context) (*lease, *RequestError) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopping {
		return nil, &RequestError{Kind: ErrShutdown, Msg: ErrShutdown.Error()}
	}
	g.active++
	l := &lease{g: g}
	l.ctx, l.cancel = g.within(ctx)
	return l, nil
}

// end ends the lease's context and gives the lease back; only the first
// call counts.
func (l *lease) end() {
	l.once.Do(func() {
		l.cancel()
		g := l.g
		g.mu.Lock()
		defer g.mu.Unlock()
		g.active--
		if g.stopping && g.active == 0 {
			close(g.idle)
		}
	})
}

// stopping is closed once the daemon's shutdown starts: a request that
// would otherwise last (a published port's forward) ends then.
func (l *lease) stopping() <-chan struct{} { return l.g.stopped }

// within returns ctx, ended also when the shutdown grace period is over;
// cancel releases it.
func (g *inflight) within(ctx context.Context) (_ context.Context, cancel func()) {
	ctx, cancelCtx := context.WithCancel(ctx)
	stop := context.AfterFunc(g.grace, cancelCtx)
	return ctx, func() {
		stop()
		cancelCtx()
	}
}

// stop refuses new leases from now on.
func (g *inflight) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopping {
		return
	}
	g.stopping = true
	close(g.stopped)
	if g.active == 0 {
		close(g.idle)
	}
}

// count is how many leases are held.
func (g *inflight) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.active
}

// over reports whether the grace period after shutdown is over.
func (g *inflight) over() bool { return g.grace.Err() != nil }
