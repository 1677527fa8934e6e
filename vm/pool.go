package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// Pool keeps up to Size VMs restored from one template, ready to hand out.
// Each VM is handed out once (Get removes it); a background filler restores
// replacements. Size 0 keeps none: every Get restores on demand.
//
// Behind the ready VMs it keeps up to Ahead clones launched ahead
// (Template.Prestart): QEMU up in its jail, waiting for its state, no
// guest code run. A restore (a Get that finds no ready VM, or the filler)
// completes one of those instead of starting QEMU; one whose QEMU died
// while it waited is closed and replaced, never used.
type Pool struct {
	tmpl   *Template
	log    *slog.Logger
	size   int
	aheadN int

	ready     chan *VM
	ahead     chan *Launched
	wake      chan struct{} // refill ready
	wakeAhead chan struct{} // refill ahead
	stop      chan struct{}
	done      chan struct{}

	mu     sync.Mutex
	closed bool
	stats  PoolStats
	// lowMemory is the MemAvailable (bytes) below which the pool stops
	// refilling and gives back its idle VMs.
	lowMemory int64
	// memAvailable reads MemAvailable; replaced by tests.
	memAvailable func() (int64, error)
}

// refillDelay is how long after handing out a VM the pool starts
// restoring its replacement.
const refillDelay = 500 * time.Millisecond

// PoolStats counts what a pool did.
type PoolStats struct {
	Ready    int // VMs waiting now
	Size     int
	Hits     int64 // Gets served from the pool
	Misses   int64 // Gets that restored on demand
	Restored int64 // VMs the filler restored
	Failures int64 // filler restores that failed
	Shrunk   int64 // idle VMs given back under memory pressure

	Ahead       int   // clones launched ahead, waiting now
	AheadSize   int   // how many the pool keeps
	AheadUsed   int64 // restores that completed one
	AheadFailed int64 // of those, the ones that failed (each replaced by a fresh restore)
}

// NewPool starts a pool of size VMs restored from tmpl, and ahead clones
// launched ahead; its VMs have the template's configuration.
func NewPool(tmpl *Template, size, ahead int) *Pool {
	size, ahead = max(size, 0), max(ahead, 0)
	p := &Pool{
		tmpl: tmpl, log: tmpl.clone.Log, size: size, aheadN: ahead,
		ready:     make(chan *VM, max(size, 1)),
		ahead:     make(chan *Launched, max(ahead, 1)),
		wake:      make(chan struct{}, 1),
		wakeAhead: make(chan struct{}, 1),
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
		// Keep room for two more VMs of this shape and the host itself.
		lowMemory:    2*int64(tmpl.Meta.MemoryMiB)<<20 + 512<<20,
		memAvailable: memAvailable,
	}
	p.stats.Size, p.stats.AheadSize = size, ahead
	go p.fill()
	p.kick()
	kick(p.wakeAhead)
	return p
}

func (p *Pool) count(f func(*PoolStats)) {
	p.mu.Lock()
	f(&p.stats)
	p.mu.Unlock()
}

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Ready, s.Ahead = len(p.ready), len(p.ahead)
	return s
}

func (p *Pool) kick() { kick(p.wake) }

func kick(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// Get returns a fresh VM: a ready one from the pool (its clock and entropy
// refreshed again, as it may have waited), or one restored now. fromPool
// says which. The caller owns the VM and closes it.
func (p *Pool) Get(ctx context.Context) (v *VM, fromPool bool, err error) {
	for {
		select {
		case v = <-p.ready:
		default:
			v = nil
		}
		if v == nil {
			break
		}
		// Refill a little later: on a small host the restore would
		// otherwise compete with the command this VM is about to run
		// (measured here: its first command 130 ms instead of 90 ms).
		time.AfterFunc(refillDelay, p.kick)
		select {
		case <-v.Exited():
			p.log.Warn("pooled VM died while idle", "vm", v.ID, "err", Details(v.died("while pooled")))
			_ = v.Close()
			continue
		default:
		}
		if err := v.Foreground(); err != nil {
			p.log.Warn("pooled VM: CPU weight", "vm", v.ID, "err", err)
		}
		if err := v.refresh(ctx, true); err != nil {
			p.log.Warn("pooled VM did not answer", "vm", v.ID, "err", err)
			_ = v.Close()
			continue
		}
		p.count(func(s *PoolStats) { s.Hits++ })
		return v, true, nil
	}
	p.kick()
	p.count(func(s *PoolStats) { s.Misses++ })
	v, err = p.restore(ctx, false)
	return v, false, err
}

// restore completes a clone launched ahead, if one waits, or restores a
// new one (at the lowest CPU weight when background: the filler's). A
// clone launched ahead that fails is replaced by the new one (and
// counted); the stock is refilled by the filler.
func (p *Pool) restore(ctx context.Context, background bool) (*VM, error) {
	select {
	case a := <-p.ahead:
		kick(p.wakeAhead)
		if !background {
			if err := a.Foreground(); err != nil {
				p.log.Warn("VM launched ahead: CPU weight", "vm", a.ID(), "err", err)
			}
		}
		v, err := a.Complete(ctx)
		p.count(func(s *PoolStats) {
			s.AheadUsed++
			if err != nil && ctx.Err() == nil {
				s.AheadFailed++
			}
		})
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		p.log.Warn("VM launched ahead failed; restoring a new one", "vm", a.ID(), "err", Details(err))
	default:
	}
	return p.tmpl.restore(ctx, background)
}

// fill keeps the pool at size and the clones launched ahead at aheadN,
// each stock by a filler of its own: a clone launched ahead is replaced at
// once (its QEMU's start is cheap), a ready VM a little after a hand-out
// (refillDelay).
func (p *Pool) fill() {
	defer close(p.done)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		keep(p, p.wake, p.ready, p.size, "restore", func(ctx context.Context) (*VM, error) {
			v, err := p.restore(ctx, true)
			if err == nil {
				err = warmUp(ctx, v)
			}
			if err == nil {
				p.count(func(s *PoolStats) { s.Restored++ })
			}
			return v, err
		})
	}()
	go func() {
		defer wg.Done()
		keep(p, p.wakeAhead, p.ahead, p.aheadN, "launch ahead", p.tmpl.Prestart)
	}()
	wg.Wait()
}

// stocked is what a pool keeps: ready VMs and clones launched ahead.
type stocked interface {
	Gone() bool
	Close() error
	// stockID and death name one that died while it waited, and why.
	stockID() string
	death() error
}

func (v *VM) stockID() string       { return v.ID }
func (v *VM) death() error          { return v.died("while waiting") }
func (a *Launched) stockID() string { return a.id }
func (a *Launched) death() error    { return a.Died() }

// keep fills stock up to n with next's VMs whenever woken (and every few
// seconds), backing off after failures and stopping under memory
// pressure.
func keep[T stocked](p *Pool, wake <-chan struct{}, stock chan T, n int, what string, next func(context.Context) (T, error)) {
	backoff := time.Second
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-wake:
		case <-tick.C:
		}
		prune(p, stock, what)
		// pressure first: it gives back a VM of a full pool too.
		for !p.pressure() && len(stock) < n {
			ctx, cancel := context.WithCancel(context.Background())
			go func() {
				select {
				case <-p.stop:
					cancel()
				case <-ctx.Done():
				}
			}()
			v, err := next(ctx)
			cancel()
			if err != nil {
				p.count(func(s *PoolStats) { s.Failures++ })
				select {
				case <-p.stop:
					return
				default:
				}
				p.log.Warn("pool: "+what+" failed", "err", Details(err), "retry_in", backoff)
				select {
				case <-p.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
			backoff = time.Second
			select {
			case stock <- v:
			case <-p.stop:
				_ = v.Close()
				return
			}
		}
	}
}

// prune closes the VMs in stock whose QEMU exited while they waited (the
// OOM killer, a crash), so that the filler replaces them now and not when
// a request finds them. Live ones go back; a Get meanwhile may find the
// stock short and restore instead.
func prune[T stocked](p *Pool, stock chan T, what string) {
	for range len(stock) {
		var v T
		select {
		case v = <-stock:
		default:
			return
		}
		if !v.Gone() {
			stock <- v // room: only this filler adds to stock
			continue
		}
		p.log.Warn("pool: a waiting VM died; replacing it", "stock", what, "vm", v.stockID(), "err", Details(v.death()))
		_ = v.Close()
		_, ahead := any(v).(*Launched)
		p.count(func(s *PoolStats) {
			if ahead {
				s.AheadFailed++
			} else {
				s.Failures++
			}
		})
	}
}

// warmUp runs a command as root and as the unprivileged user in a fresh
// clone. Under TCG a restored QEMU starts with an empty translation cache,
// so the first commands after a restore run several times slower than
// later ones; a pooled VM pays that before it is handed out. On error the
// VM is closed.
func warmUp(ctx context.Context, v *VM) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var err error
	for _, user := range []string{"root", agentproto.UnprivilegedUser} {
		var res *ExecResult
		res, err = v.Exec(ctx, ExecRequest{Argv: []string{"true"}, User: user, Env: []string{"LANG=C.UTF-8"}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("warm-up command as %s exited %d", user, res.ExitCode)
		}
		if err != nil {
			break
		}
	}
	if err != nil {
		_ = v.Close()
		return fmt.Errorf("warm up: %w", err)
	}
	return nil
}

// pressure reports low host memory; it then gives back one idle VM.
func (p *Pool) pressure() bool {
	p.mu.Lock()
	read := p.memAvailable
	p.mu.Unlock()
	avail, err := read()
	if err != nil || avail >= p.lowMemory {
		return false
	}
	select {
	case v := <-p.ready:
		p.log.Warn("pool: host memory low, giving back an idle VM", "mem_available_mib", avail>>20, "vm", v.ID)
		_ = v.Close()
		p.count(func(s *PoolStats) { s.Shrunk++ })
	case v := <-p.ahead:
		p.log.Warn("pool: host memory low, giving back a VM launched ahead", "mem_available_mib", avail>>20, "vm", v.ID())
		_ = v.Close()
		p.count(func(s *PoolStats) { s.Shrunk++ })
	default:
	}
	return true
}

// Close stops the filler and destroys the idle VMs.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	var errs []error
	for {
		select {
		case v := <-p.ready:
			errs = append(errs, v.Close())
			continue
		case v := <-p.ahead:
			errs = append(errs, v.Close())
			continue
		default:
		}
		break
	}
	return errors.Join(errs...)
}

// memAvailable reads MemAvailable from /proc/meminfo, in bytes.
func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("meminfo: %w", err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("meminfo: no MemAvailable")
}
