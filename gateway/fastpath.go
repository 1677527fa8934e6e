package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/vmgate/vmgate/vm"
)

// fastPath hands out VMs restored from templates: one template and one
// pool per VM shape (memory, CPUs, seccomp mode), built in the background
// the first time the shape is asked for. Until a shape's template is
// ready, or when it cannot be built, requests of that shape boot cold.
type fastPath struct {
	base vm.Options // image, state, accelerator, log, cgroups
	size int        // pool size per shape
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	shapes map[shapeKey]*shapeEntry
}

type shapeKey struct {
	mem, cpus int
	seccomp   string
}

type shapeEntry struct {
	ready    bool
	failedAt time.Time
	tmpl     *vm.Template
	pool     *vm.Pool
}

// retryAfter is how long a shape whose template failed boots cold before
// the build is tried again.
const retryAfter = 10 * time.Minute

func newFastPath(base vm.Options, size int, log *slog.Logger) *fastPath {
	ctx, cancel := context.WithCancel(context.Background())
	return &fastPath{base: base, size: size, log: log, ctx: ctx, cancel: cancel, shapes: map[shapeKey]*shapeEntry{}}
}

// warm starts building the template (and filling the pool) of a shape.
func (f *fastPath) warm(mem, cpus int, seccomp string) {
	f.entry(shapeKey{mem, cpus, seccomp})
}

// entry returns the shape's entry, starting its build when new or when a
// failed build may be retried.
func (f *fastPath) entry(k shapeKey) *shapeEntry {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.shapes[k]
	if e != nil && (e.ready || e.failedAt.IsZero() || time.Since(e.failedAt) < retryAfter) {
		return e
	}
	if f.ctx.Err() != nil {
		return &shapeEntry{}
	}
	e = &shapeEntry{}
	f.shapes[k] = e
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		f.build(k, e)
	}()
	return e
}

func (f *fastPath) build(k shapeKey, e *shapeEntry) {
	opts := f.base
	opts.MemoryMiB, opts.CPUs, opts.Seccomp = k.mem, k.cpus, k.seccomp
	t0 := time.Now()
	tmpl, err := vm.EnsureTemplate(f.ctx, opts)
	if err != nil {
		f.mu.Lock()
		e.failedAt = time.Now()
		f.mu.Unlock()
		if f.ctx.Err() == nil {
			f.log.Error("VM template failed; this shape boots cold", "memory_mib", k.mem, "cpus", k.cpus, "err", err, "retry_in", retryAfter)
		}
		return
	}
	pool := vm.NewPool(tmpl, opts, f.size)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil {
		_ = pool.Close()
		_ = tmpl.Close()
		return
	}
	e.tmpl, e.pool, e.ready = tmpl, pool, true
	f.log.Info("fast path ready", "template", tmpl.String(), "built", tmpl.Built, "ms", time.Since(t0).Milliseconds(), "pool_size", f.size)
}

// get returns a restored VM of the shape and how it was made ("pool":
// ready in the pool, "restore": restored now), or nil when the shape has
// no template yet (the caller boots cold).
func (f *fastPath) get(ctx context.Context, mem, cpus int, seccomp string) (*vm.VM, string, error) {
	k := shapeKey{mem, cpus, seccomp}
	e := f.entry(k)
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

// stats returns each ready shape's pool counters.
func (f *fastPath) stats() map[shapeKey]vm.PoolStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[shapeKey]vm.PoolStats{}
	for k, e := range f.shapes {
		if e.ready {
			out[k] = e.pool.Stats()
		}
	}
	return out
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
