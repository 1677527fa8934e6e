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
		{"built-in", string(DefaultTOML()), []Shape{{Image: "default", MemoryMiB: 512, CPUs: 1, DiskMiB: 1024}}},
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
name = "e"
match = { uids = [4] }
image = "python3"
[[profile]]
name = "f"
match = { uids = [5] }
disk_mib = 64
[[profile]]
name = "d"
match = { any = true }
`, []Shape{{"default", 512, 1, 1024, false}, {"default", 1024, 2, 1024, false}, {"default", 512, 1, 1024, true}, {"python3", 512, 1, 1024, false},
			{"default", 512, 1, 64, false}}},
	} {
		got := mustParse(t, c.name, c.src).Shapes()
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	if (*Policy)(nil).Shapes() != nil {
		t.Error("nil policy has shapes")
	}
	imgs := mustParse(t, "images", "version = 1\n[[profile]]\nname = \"a\"\nmatch = { uids = [1] }\nimage = \"ml\"\n[[profile]]\nname = \"b\"\nmatch = { any = true }\n").Images()
	if want := []ProfileImage{{"a", "ml", ""}, {"b", "default", ""}}; !reflect.DeepEqual(imgs, want) {
		t.Errorf("Images() = %+v, want %+v", imgs, want)
	}
}
