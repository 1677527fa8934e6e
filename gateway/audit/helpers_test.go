package audit

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// memFile is an in-memory file. quota >= 0 makes writes beyond quota bytes
// fail with ENOSPC after writing what fits, as write(2) does; syncErr makes
// Sync fail, and with loseUnsynced a failed Sync drops what was written
// since the last good one, as the kernel may drop dirty pages whose
// writeback failed.
type memFile struct {
	mu           sync.Mutex
	buf          []byte
	quota        int
	syncErr      error
	loseUnsynced bool
	durable      int
	syncs        int
	closed       bool
}

func newMemFile(content []byte) *memFile {
	return &memFile{buf: append([]byte(nil), content...), quota: -1}
}

func (m *memFile) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, os.ErrClosed
	}
	if m.quota >= 0 && len(m.buf)+len(p) > m.quota {
		n := max(m.quota-len(m.buf), 0)
		m.buf = append(m.buf, p[:n]...)
		return n, &os.PathError{Op: "write", Path: "mem", Err: syscall.ENOSPC}
	}
	m.buf = append(m.buf, p...)
	return len(p), nil
}

func (m *memFile) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if off >= int64(len(m.buf)) {
		return 0, io.EOF
	}
	n := copy(p, m.buf[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m *memFile) Sync() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.syncs++
	if m.syncErr != nil {
		if m.loseUnsynced {
			m.buf = m.buf[:min(m.durable, len(m.buf))]
		}
		return &os.PathError{Op: "sync", Path: "mem", Err: m.syncErr}
	}
	m.durable = len(m.buf)
	return nil
}

func (m *memFile) set(f func(m *memFile)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

func (m *memFile) Truncate(size int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.buf = m.buf[:size]
	m.durable = min(m.durable, int(size))
	return nil
}

func (m *memFile) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

func (m *memFile) bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]byte(nil), m.buf...)
}

func (m *memFile) syncCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.syncs
}

// openMem opens a Log on m.
func openMem(t testing.TB, m *memFile, opts Options) *Log {
	t.Helper()
	if opts.Path == "" {
		opts.Path = "mem"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	l, err := open(opts, func(string) (file, int64, error) { return m, int64(len(m.bytes())), nil })
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// openDisk opens a Log in a fresh temporary directory.
func openDisk(t testing.TB, opts Options) (*Log, string) {
	t.Helper()
	if opts.Path == "" {
		opts.Path = filepath.Join(t.TempDir(), "audit", "audit.jsonl")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	l, err := Open(opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, opts.Path
}

// rec returns a typical exec record numbered i.
func rec(i int) Record {
	return Record{
		Kind:      KindExec,
		RequestID: fmt.Sprintf("req-%d", i),
		UID:       new(uint32(1000)),
		GID:       new(uint32(1000)),
		PID:       4242,
		Argv:      []string{"echo", fmt.Sprint(i)},
		ExitCode:  new(0),
		Message:   fmt.Sprintf("record %d", i),
	}
}

func writeN(t testing.TB, l *Log, from, to int) {
	t.Helper()
	for i := from; i <= to; i++ {
		if err := l.Write(rec(i)); err != nil {
			t.Fatalf("Write %d: %v", i, err)
		}
	}
}

// eventually polls cond for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
