package procstat

import (
	"slices"
	"testing"
)

func TestFields(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     []string
		ok       bool
	}{
		{"plain", "42 (sleep) S 1 42 42 0", []string{"S", "1", "42", "42", "0"}, true},
		{"name with blanks and parentheses", "42 (a) b (c)) R 7\n", []string{"R", "7"}, true},
		{"nothing after the name", "42 (x)", nil, true},
		{"no name", "42 x S 1", nil, false},
		{"empty", "", nil, false},
	} {
		got, ok := Fields(c.in)
		if ok != c.ok || !slices.Equal(got, c.want) {
			t.Errorf("%s: %q %v, want %q %v", c.name, got, ok, c.want, c.ok)
		}
	}
}
