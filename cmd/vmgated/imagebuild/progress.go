package imagebuild

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// progress shows build steps: on a TTY (w != nil) one line redrawn every
// second with a bar of the steps, the elapsed time, the step, and inside a
// step the packages set up so far and the tool's latest line; always as
// log records.
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
	failed  bool
	line    string // the running tool's latest line
	setUp   int    // packages the tool has set up in this step
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
	p.line, p.setUp = "", 0
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
	fmt.Fprintf(p.w, "\r\033[K%s", p.render(time.Since(p.start)))
}

// render is the progress line (pure but for p's state): bar, step count,
// elapsed time, step, and the tool's progress inside it.
func (p *progress) render(elapsed time.Duration) string {
	const width = 20
	done := (p.n - 1) * width / max(p.total, 1)
	bar := strings.Repeat("█", done) + strings.Repeat("░", width-done)
	s := fmt.Sprintf("%s %d/%d %s %s", bar, p.n, p.total, elapsed.Round(time.Second), p.name)
	if p.setUp > 0 {
		s += fmt.Sprintf(": %d packages set up", p.setUp)
	}
	if p.line != "" {
		s += " · " + p.line
	}
	if r := []rune(s); len(r) > 110 {
		s = string(r[:109]) + "…"
	}
	return s
}

// detail takes one line of the running tool's output (mmdebstrap, apt,
// dpkg): it counts packages set up and shows the line.
func (p *progress) detail(line string) {
	line = strings.TrimSpace(line)
	if line == "" {
		return
	}
	p.mu.Lock()
	if strings.HasPrefix(line, "Setting up ") {
		p.setUp++
	}
	p.line = line
	p.mu.Unlock()
	p.draw()
}

// lines passes each line written to it to fn.
type lines struct {
	fn  func(string)
	buf []byte
}

func (l *lines) Write(b []byte) (int, error) {
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexAny(l.buf, "\r\n")
		if i < 0 {
			if len(l.buf) > 4096 {
				l.buf = l.buf[:0]
			}
			return len(b), nil
		}
		l.fn(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
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

// fail marks the build as failed, for stop's last line.
func (p *progress) fail() {
	p.mu.Lock()
	p.failed = true
	p.mu.Unlock()
}

func (p *progress) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	failed, name := p.failed, p.name
	p.mu.Unlock()
	close(p.done)
	if p.w == nil {
		return
	}
	if failed {
		fmt.Fprintf(p.w, "\r\033[Kfailed after %s, in step %q\n", time.Since(p.start).Round(time.Second), name)
		return
	}
	fmt.Fprintf(p.w, "\r\033[Kdone in %s\n", time.Since(p.start).Round(time.Second))
}
