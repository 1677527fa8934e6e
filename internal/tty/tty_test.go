package tty

import "testing"

func TestBounds(t *testing.T) {
	for _, c := range []struct {
		cols, rows uint32
		ok         bool
	}{{0, 0, true}, {80, 24, true}, {4096, 4096, true}, {4097, 1, false}, {1, 4097, false}} {
		if SizeOK(c.cols, c.rows) != c.ok {
			t.Errorf("%dx%d: want %v", c.cols, c.rows, c.ok)
		}
	}
	for term, ok := range map[string]bool{"xterm-256color": true, "": true, "a\nb": false, "a\x00": false, string(make([]byte, 65)): false} {
		if NameOK(term) != ok {
			t.Errorf("%q: want %v", term, ok)
		}
	}
}
