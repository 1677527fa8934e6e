package audit

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOpen_SecondWriterLocked(t *testing.T) {
	l, path := openDisk(t, Options{})
	if _, err := Open(Options{Path: path}); !errors.Is(err, errLocked) {
		t.Fatalf("second Open: %v, want errLocked", err)
	}
	l.Close()
	l2, _ := openDisk(t, Options{Path: path})
	l2.Close()
}

func TestOpen_RefusesFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(path, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Path: path}); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("Open: %v, want not a regular file", err)
	}
}
