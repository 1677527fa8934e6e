package gateway

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/guestnet"
)

// fastPath hands out VMs restored from templates: one template and one
// pool per VM shape (memory, CPUs, seccomp mode, NIC or not), built in the
// background the first time the shape is asked for. Until a shape's
// template is ready, or when it cannot be built, requests of that shape
// boot cold.
//
// A VM of a shape with a NIC comes with a network that allows nothing
// (netBase); the caller gives it the request's policy.
type fastPath struct {
	base    vm.Options      // image, state, accelerator, log, cgroups
	netBase guestnet.Config // plumbing of a VM's network (resolver, log), no policy
	size    int             // pool size per shape
	log     *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// building admits one template build (a boot) at a time: on a small
	// host parallel builds only slow each other and the cold boots that
	// serve requests meanwhile.
	building chan struct{}

	mu     sync.Mutex
	shapes map[shapeKey]*shapeEntry
	// pastFailures counts the handshake failures of discarded templates.
	pastFailures int64
}

type shapeKey struct {
	mem, cpus int
	seccomp   string
	network   bool // the VMs have a NIC
}

type shapeEntry struct {
	// loaded is closed once the attempt to load an existing template
	// ended (ready, or building now, or failed): a request waits for a
	// load (a second or so), never for a build.
	loaded   chan struct{}
	ready    bool
	failedAt time.Time // the build failed; retried after retryAfter
	tmpl     *vm.Template
	pool     *vm.Pool
}

// retryAfter is how long a shape whose template failed boots cold before
// the build is tried again.
const retryAfter = 10 * time.Minute

func newFastPath(base vm.Options, netBase guestnet.Config, size int, log *slog.Logger) *fastPath {
	ctx, cancel := context.WithCancel(context.Background())
	return &fastPath{base: base, netBase: netBase, size: size, log: log, ctx: ctx, cancel: cancel,
		building: make(chan struct{}, 1), shapes: map[shapeKey]*shapeEntry{}}
}

// options returns the VM options of a shape.
func (f *fastPath) options(k shapeKey) vm.Options {
	opts := f.base
	opts.MemoryMiB, opts.CPUs, opts.Seccomp = k.mem, k.cpus, k.seccomp
	if k.network {
		nc := f.netBase
		opts.Network = &nc
	}
	return opts
}

// warm loads (or builds) the template of a shape and fills its pool.
func (f *fastPath) warm(k shapeKey) {
	f.entry(k)
}

// entry returns the shape's entry, starting its load (and, when there is
// no template, its build) when new or when a failed build may be retried.
func (f *fastPath) entry(k shapeKey) *shapeEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.shapes[k]
	if e != nil && (e.ready || e.failedAt.IsZero() || time.Since(e.failedAt) < retryAfter) {
		return e
	}
	if f.ctx.Err() != nil {
		e := &shapeEntry{loaded: make(chan struct{})}
		close(e.loaded)
		return e
	}
	e = &shapeEntry{loaded: make(chan struct{})}
	f.shapes[k] = e
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.build(k, e)
	}()
	return e
}

func (f *fastPath) build(k shapeKey, e *shapeEntry) {
	opts := f.options(k)
	t0 := time.Now()
	tmpl, err := vm.LoadTemplate(f.ctx, opts)
	if err == nil {
		f.ready(k, e, tmpl, t0)
		close(e.loaded)
		return
	}
	close(e.loaded)
	if errors.Is(err, vm.ErrNoTemplate) {
		f.log.Info("building the VM template of a shape; its requests boot cold meanwhile", "memory_mib", k.mem, "cpus", k.cpus, "network", k.network, "why", err)
		select {
		case f.building <- struct{}{}:
			tmpl, err = vm.EnsureTemplate(f.ctx, opts)
			<-f.building
		case <-f.ctx.Done():
			err = f.ctx.Err()
		}
	}
	if err != nil {
		f.mu.Lock()
		e.failedAt = time.Now()
		f.mu.Unlock()
		if f.ctx.Err() == nil {
			f.log.Error("VM template failed; this shape boots cold", "memory_mib", k.mem, "cpus", k.cpus, "network", k.network, "err", err, "retry_in", retryAfter)
		}
		return
	}
	f.ready(k, e, tmpl, t0)
}

// ready starts the shape's pool on its template.
func (f *fastPath) ready(k shapeKey, e *shapeEntry, tmpl *vm.Template, t0 time.Time) {
	pool := vm.NewPool(tmpl, f.options(k), f.size)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil {
		_ = pool.Close()
		_ = tmpl.Close()
		return
	}
	e.tmpl, e.pool, e.ready = tmpl, pool, true
	f.log.Info("fast path ready", "template", tmpl.String(), "network", k.network, "built", tmpl.Built, "ms", time.Since(t0).Milliseconds(), "pool_size", f.size)
}

// get returns a restored VM of the shape and how it was made ("pool":
// ready in the pool, "restore": restored now), or nil when the shape has
// no template yet (the caller boots cold).
func (f *fastPath) get(ctx context.Context, k shapeKey) (*vm.VM, string, error) {
	e := f.entry(k)
	select {
	case <-e.loaded:
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	f.mu.Lock()
	ready, pool := e.ready, e.pool
	f.mu.Unlock()
	if !ready {
		return nil, "", nil
	}
	v, fromPool, err := pool.Get(ctx)
	if err != nil {
		if ctx.Err() == nil {
			f.discard(k, e, err)
		}
		return nil, "", err
	}
	if fromPool {
		return v, "pool", nil
	}
	return v, "restore", nil
}

// discard drops a shape whose restore failed: its pool is closed and its
// template removed, so the next request of the shape starts a rebuild
// (and boots cold meanwhile).
func (f *fastPath) discard(k shapeKey, e *shapeEntry, why error) {
	f.mu.Lock()
	if f.shapes[k] != e || !e.ready || f.ctx.Err() != nil {
		f.mu.Unlock()
		return
	}
	delete(f.shapes, k)
	f.pastFailures += e.tmpl.HandshakeFailures()
	f.mu.Unlock()
	f.log.Error("restore from template failed: discarding the template; it is rebuilt on the next request", "template", e.tmpl.String(), "err", why)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		if err := e.pool.Close(); err != nil {
			f.log.Warn("close pool", "err", err)
		}
		if err := e.tmpl.Discard(); err != nil {
			f.log.Warn("remove template", "err", err)
		}
	}()
}

// shapeStats is what the status reports of a ready shape.
type shapeStats struct {
	pool vm.PoolStats
	// handshakeFailures counts restores whose first agent handshake
	// failed (each replaced by a second clone).
	handshakeFailures int64
}

// stats returns each ready shape's counters.
func (f *fastPath) stats() map[shapeKey]shapeStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[shapeKey]shapeStats{}
	for k, e := range f.shapes {
		if e.ready {
			out[k] = shapeStats{pool: e.pool.Stats(), handshakeFailures: e.tmpl.HandshakeFailures()}
		}
	}
	return out
}

// handshakeFailures counts, over the daemon's life, restores whose first
// agent handshake failed.
func (f *fastPath) handshakeFailures() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.pastFailures
	for _, e := range f.shapes {
		if e.ready {
			n += e.tmpl.HandshakeFailures()
		}
	}
	return n
}

// close stops building, destroys pooled VMs and releases templates.
func (f *fastPath) close() {
	f.cancel()
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, e := range f.shapes {
		if e.ready {
			if err := e.pool.Close(); err != nil {
				f.log.Warn("close pool", "err", err)
			}
			_ = e.tmpl.Close()
		}
		delete(f.shapes, k)
	}
}
