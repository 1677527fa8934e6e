package testutil

import (
	"bytes"
	"sync"
)

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers
// (logs and output collected from other goroutines or processes).
type SyncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	pending []watch
}

type watch struct {
	want string
	seen chan struct{}
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	b.notifyLocked()
	return n, err
}

// Seen returns a channel that is closed once the contents hold want.
func (b *SyncBuffer) Seen(want string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := watch{want, make(chan struct{})}
	b.pending = append(b.pending, w)
	b.notifyLocked()
	return w.seen
}

func (b *SyncBuffer) notifyLocked() {
	kept := b.pending[:0]
	for _, w := range b.pending {
		if bytes.Contains(b.buf.Bytes(), []byte(w.want)) {
			close(w.seen)
		} else {
			kept = append(kept, w)
		}
	}
	b.pending = kept
}

// String returns the contents so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Bytes returns a copy of the contents so far.
func (b *SyncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
