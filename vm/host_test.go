package vm

import "testing"

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
