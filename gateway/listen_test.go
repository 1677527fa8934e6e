package gateway

import (
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// TestListenUnixModes: the socket gets the configured mode, and a stale
// socket is replaced.
func TestListenUnixModes(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "run", "vmgate.sock")
	for _, mode := range []fs.FileMode{0o600, 0o660} {
		ln, err := listenUnix(path, mode, "", slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode()&fs.ModeSocket == 0 || st.Mode().Perm() != mode {
			t.Errorf("socket %v, want a socket with %v", st.Mode(), mode)
		}
		ln.Close() // leaves the file: the next round removes it as stale
	}
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := listenUnix(filepath.Join(dir, "file"), 0o600, "", slog.Default()); err == nil {
		t.Error("a regular file in the socket's place was replaced")
	}
}

// TestListenUnixLeavesUmaskAlone: the daemon starts its template build
// before it listens, so directories are made while the socket is created.
// The umask is process-wide: changing it for the socket once made a VM
// directory without its search bit, which the jail could not enter.
func TestListenUnixLeavesUmaskAlone(t *testing.T) {
	dir := t.TempDir()
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bad atomic.Int64
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			d := filepath.Join(dir, "vms", "d", string(rune('a'+i%26))+"x")
			if err := os.MkdirAll(d, 0o700); err != nil {
				continue
			}
			if st, err := os.Stat(d); err == nil && st.Mode().Perm() != 0o700 {
				bad.Add(1)
			}
			_ = os.Remove(d)
		}
	})
	for range 300 {
		ln, err := listenUnix(filepath.Join(dir, "s.sock"), 0o660, "", slog.Default())
		if err != nil {
			t.Fatal(err)
		}
		ln.Close()
	}
	stop.Store(true)
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Errorf("%d directories made while the socket was created lost permission bits", n)
	}
}
