package policy

import (
	"reflect"
	"testing"
)

func TestShapes(t *testing.T) {
	for _, c := range []struct {
		name, src string
		want      []Shape
	}{
		{"built-in", string(DefaultTOML()), []Shape{{MemoryMiB: 512, CPUs: 1}}},
		{"distinct and repeated", `version = 1
[[profile]]
name = "a"
match = { uids = [1] }
[[profile]]
name = "b"
match = { uids = [2] }
memory_mib = 1024
cpus = 2
[[profile]]
name = "c"
match = { uids = [3] }
[profile.network]
mode = "allowlist"
allow = ["example.com:443"]
[[profile]]
name = "d"
match = { any = true }
`, []Shape{{512, 1, false}, {1024, 2, false}, {512, 1, true}}},
	} {
		got := mustParse(t, c.name, c.src).Shapes()
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	if (*Policy)(nil).Shapes() != nil {
		t.Error("nil policy has shapes")
	}
}
