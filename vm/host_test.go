package vm

import (
	"testing"
	"time"
)

// TestShapeNormal: a shape that leaves its image unnamed and one that
// names the default image are one shape (one template, one pool): the
// daemon warms the first and requests ask for the second.
func TestShapeNormal(t *testing.T) {
	a := Shape{MemoryMiB: 512, CPUs: 1}.normal()
	b := Shape{Image: DefaultImage, MemoryMiB: 512, CPUs: 1}.normal()
	if a != b {
		t.Fatalf("%+v and %+v are different shapes", a, b)
	}
	if c := (Shape{Image: "ml", MemoryMiB: 512, CPUs: 1}).normal(); c == a {
		t.Fatal("another image is the same shape")
	}
}

// TestHost_GetRefusesBadImageName: a shape naming no valid image is an
// error, never the default image in its place.
func TestHost_GetRefusesBadImageName(t *testing.T) {
	h := &Host{cfg: HostConfig{ImageDir: "/nonexistent/default", StateDir: t.TempDir()}}
	for _, name := range []string{"../x", "a/b", ".hidden"} {
		if _, _, err := h.Get(t.Context(), Shape{Image: name}); err == nil {
			t.Errorf("Get with image %q: no error", name)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{{1, 30 * time.Second}, {2, time.Minute}, {3, 2 * time.Minute}, {5, 8 * time.Minute}, {6, 10 * time.Minute}, {40, 10 * time.Minute}} {
		if got := retryAfter(tc.failures); got != tc.want {
			t.Errorf("retryAfter(%d) = %v, want %v", tc.failures, got, tc.want)
		}
	}
}
