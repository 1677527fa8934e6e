package image

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"
)

// progress shows build steps: on a TTY (w != nil) one line redrawn every
// second with the step number and elapsed time; always as log records.
type progress struct {
	w     io.Writer
	log   *slog.Logger
	total int

	mu      sync.Mutex
	n       int
	name    string
	start   time.Time
	stepAt  time.Time
	done    chan struct{}
	stopped bool
}

func newProgress(w io.Writer, log *slog.Logger, total int) *progress {
	p := &progress{w: w, log: log, total: total, start: time.Now(), done: make(chan struct{})}
	if w != nil {
		go p.tick()
	}
	return p
}

func (p *progress) step(name string) {
	p.mu.Lock()
	if p.n > 0 {
		p.log.Info("build step done", "step", p.name, "seconds", time.Since(p.stepAt).Round(100*time.Millisecond).Seconds())
	}
	p.n++
	p.name = name
	p.stepAt = time.Now()
	p.mu.Unlock()
	p.log.Info("build step", "n", p.n, "of", p.total, "step", name)
	p.draw()
}

func (p *progress) draw() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped || p.n == 0 {
		return
	}
	el := time.Since(p.start).Round(time.Second)
	fmt.Fprintf(p.w, "\r\033[K[%d/%d %s] %s", p.n, p.total, el, p.name)
}

func (p *progress) tick() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			p.draw()
		}
	}
}

func (p *progress) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	p.mu.Unlock()
	close(p.done)
	if p.w != nil {
		fmt.Fprintf(p.w, "\r\033[K[done %s]\n", time.Since(p.start).Round(time.Second))
	}
}
