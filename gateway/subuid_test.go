package gateway

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestParseSubUIDs(t *testing.T) {
	tests := []struct {
		name     string
		text     string
		ranges   []subRange
		problems []string // substrings, one per problem
	}{
		{"debian default", "alice:100000:65536\nbob:165536:65536\n",
			[]subRange{{"alice", 100000, 65536}, {"bob", 165536, 65536}}, nil},
		{"numeric owner, no final newline", "1000:100000:65536",
			[]subRange{{"1000", 100000, 65536}}, nil},
		{"blank and comment lines", "\n# ranges\nalice:100000:10\n\n",
			[]subRange{{"alice", 100000, 10}}, nil},
		{"strtoul bases", "alice:0x186a0:010\nbob:0:1\n",
			[]subRange{{"alice", 100000, 8}, {"bob", 0, 1}}, nil},
		{"empty range", "alice:100000:0\n", nil, nil},
		{"whole uid space", "alice:0:4294967295\n", []subRange{{"alice", 0, 4294967295}}, nil},
		{"bad lines skipped", "alice:100000\nbob:1:2:3\n:1:2\ncarol:x:1\ndave:1:-1\neve: 1:1\nfrank:08:1\ngina:0x:1\nhal:1_0:1\nok:5:5\n",
			[]subRange{{"ok", 5, 5}}, []string{
				"line 1: 2 fields", "line 2: 4 fields", "line 3: empty owner", `line 4: first uid: "x" is not a number`,
				`line 5: count: "-1" is not a number`, `line 6: first uid: " 1"`, `line 7: first uid: "08"`, `line 8: first uid: "0x"`,
				`line 9: first uid: "1_0"`}},
		{"past the last uid", "alice:4294967295:2\nbob:4294967296:1\n", nil,
			[]string{"line 1: range 4294967295+2 goes past the last uid", `line 2: first uid: "4294967296" is above 4294967295`}},
		{"CRLF is not a number", "alice:100000:65536\r\n", nil, []string{`line 1: count: "65536\r"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ranges, problems := parseSubUIDs([]byte(tt.text))
			if !reflect.DeepEqual(ranges, tt.ranges) {
				t.Errorf("ranges %v, want %v", ranges, tt.ranges)
			}
			if len(problems) != len(tt.problems) {
				t.Fatalf("problems %q, want %d", problems, len(tt.problems))
			}
			for i, p := range problems {
				if !strings.Contains(p, tt.problems[i]) {
					t.Errorf("problem %d: %q, want %q in it", i, p, tt.problems[i])
				}
			}
		})
	}
}

func TestSubRangeOwnerUID(t *testing.T) {
	for owner, want := range map[string]int64{"1000": 1000, "0": 0, "alice": -1, "01000": -1, "+1000": -1, "4294967296": -1} {
		got := int64(-1)
		if uid, ok := (subRange{Owner: owner}).ownerUID(); ok {
			got = int64(uid)
		}
		if got != want {
			t.Errorf("%q: uid %d, want %d (-1: a name)", owner, got, want)
		}
	}
}

// FuzzParseSubUIDs: the parser never panics, and every range it returns
// is one it was given, non-empty and within the uid space.
func FuzzParseSubUIDs(f *testing.F) {
	for _, s := range []string{"alice:100000:65536\n", "1000:0x10:010", "a:4294967295:1\n#x\n\nb::", "x:1:2:3\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ranges, problems := parseSubUIDs(b)
		lines := strings.Count(string(b), "\n") + 1
		if len(ranges)+len(problems) > lines {
			t.Fatalf("%d ranges and %d problems from %d lines", len(ranges), len(problems), lines)
		}
		for _, r := range ranges {
			if r.Count == 0 || uint64(r.First)+uint64(r.Count)-1 > 1<<32-1 || r.Owner == "" || strings.ContainsAny(r.Owner, ":\n") {
				t.Fatalf("bad range %+v", r)
			}
			if !r.contains(r.First) || !r.contains(uint32(uint64(r.First)+uint64(r.Count)-1)) || r.First > 0 && r.contains(r.First-1) {
				t.Fatalf("range %+v: contains is wrong at its ends", r)
			}
		}
	})
}

// TestSubUIDFileReload: the file is parsed once per version, a change is
// seen on the next load, and a missing file has no ranges.
func TestSubUIDFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "subuid")
	f := &subUIDFile{path: path}
	if rs, _, _, err := f.load(); err != nil || rs != nil {
		t.Fatalf("missing file: %v %v", rs, err)
	}
	if err := os.WriteFile(path, []byte("alice:100000:65536\nbad\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, problems, fresh, err := f.load()
	if err != nil || !fresh || len(rs) != 1 || len(problems) != 1 {
		t.Fatalf("first load: %v %q fresh=%v %v", rs, problems, fresh, err)
	}
	if rs, problems, fresh, err = f.load(); err != nil || fresh || len(rs) != 1 || problems != nil {
		t.Fatalf("second load of the same file: %v %q fresh=%v %v", rs, problems, fresh, err)
	}
	// Replaced as editors and usermod do: a new inode, the same size.
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte("bobby:200000:65536\nbad\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	if rs, _, fresh, err = f.load(); err != nil || !fresh || len(rs) != 1 || rs[0].Owner != "bobby" {
		t.Fatalf("after the change: %v fresh=%v %v", rs, fresh, err)
	}
	if err := os.WriteFile(path, []byte(strings.Repeat("#\n", maxSubUIDBytes/2+1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err = f.load(); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("an oversized file: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if rs, _, _, err = f.load(); err != nil || rs != nil {
		t.Fatalf("removed file: %v %v", rs, err)
	}
}
