package transfer

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var (
	roomy     = Rules{Dir: FromGuest, Limits: Limits{MaxBytes: 1 << 20, MaxFiles: 100}}
	intoGuest = Rules{Dir: IntoGuest, Limits: roomy.Limits}
)

// entry is one tar entry of a crafted stream.
type entry struct {
	name, link, body string
	typ              byte
	mode             int64
	size             int64 // declared size when it differs from body
}

func craft(t testing.TB, es ...entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.size != 0 {
			h.Size = e.size
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.body != "" {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A declared size the body does not fill (a bomb) makes Close fail:
	// the stream then ends inside that entry, as a hostile one would.
	_ = tw.Close()
	return b.Bytes()
}

func dir(name string) entry         { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func file(name, body string) entry  { return entry{name: name, typ: tar.TypeReg, body: body} }
func symlink(name, to string) entry { return entry{name: name, typ: tar.TypeSymlink, link: to} }

// hostile are streams a guest may answer a --get with; every one is
// refused and writes nothing.
var hostile = []struct {
	name    string
	entries []entry
	want    string
}{
	{"traversal", []entry{dir("top"), file("top/../../evil", "x")}, "not a clean name"},
	{"traversal as top", []entry{file("../evil", "x")}, "not a clean name"},
	{"absolute name", []entry{file("/etc/evil", "x")}, "not a relative name"},
	{"absolute symlink", []entry{dir("top"), symlink("top/l", "/etc/passwd")}, "absolute symlink"},
	{"symlink out", []entry{dir("top"), symlink("top/l", "../../home")}, "leads out of the transfer"},
	{"write through symlink", []entry{dir("top"), symlink("top/l", "."), file("top/l/x", "x")}, "not beneath a directory"},
	{"device node", []entry{dir("top"), {name: "top/null", typ: tar.TypeChar}}, "device files"},
	{"block device", []entry{dir("top"), {name: "top/sda", typ: tar.TypeBlock}}, "device files"},
	{"fifo", []entry{dir("top"), {name: "top/f", typ: tar.TypeFifo}}, "FIFOs"},
	{"hard link", []entry{dir("top"), file("top/a", "x"), {name: "top/b", typ: tar.TypeLink, link: "/etc/shadow"}}, "hard links"},
	{"second tree", []entry{dir("top"), file("other", "x")}, "not beneath a directory"},
	{"orphan", []entry{dir("top"), file("top/missing/x", "x")}, "not beneath a directory"},
	{"duplicate", []entry{dir("top"), file("top/a", "x"), file("top/a", "y")}, "given twice"},
	{"symlink top", []entry{symlink("top", ".")}, "must be a file or a directory"},
	{"nested top", []entry{dir("a/b")}, "one path element"},
	{"bomb by size", []entry{dir("top"), {name: "top/big", typ: tar.TypeReg, size: 1 << 40}}, "over the transfer limit"},
	{"bomb by count", append([]entry{dir("top")}, manyFiles(200)...), "more than 100 files"},
}

func manyFiles(n int) []entry {
	var out []entry
	for i := range n {
		out = append(out, file("top/f"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+string(rune('a'+i/26)), ""))
	}
	return out
}

func TestCheckRefusesHostileStreams(t *testing.T) {
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := Check(bytes.NewReader(craft(t, tc.entries...)), &out, roomy)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestExtractRefusesHostileStreamsAndLeavesNothing(t *testing.T) {
	for _, tc := range hostile {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			parent := filepath.Join(base, "target")
			if err := os.Mkdir(parent, 0o755); err != nil {
				t.Fatal(err)
			}
			_, err := Extract(bytes.NewReader(craft(t, tc.entries...)), parent, "out", roomy)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Extract: %v, want an error containing %q", err, tc.want)
			}
			for _, d := range []string{base, parent} {
				ents, _ := os.ReadDir(d)
				if d == base && len(ents) == 1 || d == parent && len(ents) == 0 {
					continue
				}
				t.Errorf("%s holds %v after a refused stream", d, names(ents))
			}
		})
	}
}

func names(es []fs.DirEntry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	return out
}

func TestIntoGuestAllowsAnySymlink(t *testing.T) {
	s := craft(t, dir("venv"), symlink("venv/python", "/usr/bin/python3"), symlink("venv/up", "../.."))
	if _, err := Check(bytes.NewReader(s), &bytes.Buffer{}, intoGuest); err != nil {
		t.Fatal(err)
	}
	if _, err := Check(bytes.NewReader(s), &bytes.Buffer{}, roomy); err == nil {
		t.Fatal("FromGuest accepted an absolute symlink")
	}
}

func TestCheckNormalises(t *testing.T) {
	s := craft(t, dir("top"), entry{name: "top/suid", typ: tar.TypeReg, body: "#!/bin/sh\n", mode: 0o4755}, symlink("top/l", "suid"))
	var out bytes.Buffer
	sum, err := Check(bytes.NewReader(s), &out, roomy)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Files != 3 || sum.Bytes != 10 || sum.Top != "top" || sum.FileSHA256 != "" {
		t.Errorf("summary %+v", sum)
	}
	if h := sha256.Sum256(out.Bytes()); hex.EncodeToString(h[:]) != sum.SHA256 {
		t.Error("SHA256 is not the written stream's")
	}
	tr := tar.NewReader(&out)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Mode&^0o777 != 0 {
			t.Errorf("%s: mode %o kept more than permission bits", h.Name, h.Mode)
		}
	}
}

func TestLimitsCountFilesAndBytes(t *testing.T) {
	s := craft(t, dir("top"), file("top/a", "12345"), file("top/b", "67890"))
	for _, tc := range []struct {
		lim Limits
		ok  bool
	}{
		{Limits{MaxBytes: 10, MaxFiles: 3}, true},
		{Limits{MaxBytes: 9, MaxFiles: 3}, false},
		{Limits{MaxBytes: 10, MaxFiles: 2}, false},
		{Limits{}, false},
	} {
		_, err := Check(bytes.NewReader(s), &bytes.Buffer{}, Rules{Limits: tc.lim})
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrLimit)) {
			t.Errorf("limits %+v: %v", tc.lim, err)
		}
	}
}

func TestEmptyStreamIsAnError(t *testing.T) {
	if _, err := Check(bytes.NewReader(craft(t)), &bytes.Buffer{}, roomy); err == nil {
		t.Fatal("Check accepted an empty stream")
	}
	if _, err := Check(strings.NewReader("not a tar stream at all, just text that is long enough................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................................."), &bytes.Buffer{}, roomy); err == nil {
		t.Fatal("Check accepted garbage")
	}
}

// tree builds a small tree under dir/name.
func tree(t *testing.T, root string) string {
	t.Helper()
	top := filepath.Join(root, "proj")
	for p, body := range map[string]string{"a.txt": "alpha\n", "sub/b.bin": "\x00\x01\x02", "sub/deep/c": ""} {
		p = filepath.Join(top, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub/b.bin", filepath.Join(top, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(top, "a.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	return top
}

func TestPackCheckExtractRoundTrip(t *testing.T) {
	src := tree(t, t.TempDir())
	m, err := Measure(src, roomy)
	if err != nil {
		t.Fatal(err)
	}
	var packed bytes.Buffer
	ps, err := Pack(&packed, src, roomy)
	if err != nil {
		t.Fatal(err)
	}
	if m.Files != ps.Files || m.Bytes != ps.Bytes || ps.Files != 7 || ps.Bytes != 9 {
		t.Fatalf("Measure %+v, Pack %+v", m, ps)
	}
	var checked bytes.Buffer
	cs, err := Check(&packed, &checked, roomy)
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	es, err := Extract(&checked, dst, "copy", roomy)
	if err != nil {
		t.Fatal(err)
	}
	if es.SHA256 != cs.SHA256 || es.Files != cs.Files {
		t.Errorf("Extract summary %+v, Check summary %+v", es, cs)
	}
	got, err := os.ReadFile(filepath.Join(dst, "copy/sub/b.bin"))
	if err != nil || string(got) != "\x00\x01\x02" {
		t.Errorf("sub/b.bin: %q, %v", got, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "copy/link")); err != nil || l != "sub/b.bin" {
		t.Errorf("link: %q, %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "copy/a.txt")); err != nil || fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("a.txt lost its execute bit: %v %v", fi.Mode(), err)
	}
	if ents, _ := os.ReadDir(dst); len(ents) != 1 {
		t.Errorf("destination holds %v, want only copy", names(ents))
	}
}

func TestSingleFileHasItsHash(t *testing.T) {
	src := filepath.Join(t.TempDir(), "f.txt")
	if err := os.WriteFile(src, []byte("hello\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	sum, err := Pack(&b, src, intoGuest)
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte("hello\n"))
	if sum.FileSHA256 != hex.EncodeToString(want[:]) || sum.Top != "f.txt" {
		t.Errorf("summary %+v", sum)
	}
}

func TestPackRefusesSpecialFiles(t *testing.T) {
	d := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := mkfifo(filepath.Join(d, "pipe")); err != nil {
		t.Skip("mkfifo:", err)
	}
	if _, err := Pack(&bytes.Buffer{}, d, intoGuest); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("Pack: %v", err)
	}
	if _, err := Pack(&bytes.Buffer{}, "/", intoGuest); err == nil {
		t.Fatal("Pack copied /")
	}
}

func TestPlaceReplacesOnlyAFileWithAFile(t *testing.T) {
	one := craft(t, file("f", "new"))
	tree := craft(t, dir("d"), file("d/x", "x"))
	for _, tc := range []struct {
		name     string
		existing func(string) error
		stream   []byte
		ok       bool
	}{
		{"file over file", func(p string) error { return os.WriteFile(p, []byte("old"), 0o644) }, one, true},
		{"file over directory", func(p string) error { return os.Mkdir(p, 0o755) }, one, false},
		{"directory over file", func(p string) error { return os.WriteFile(p, []byte("old"), 0o644) }, tree, false},
		{"directory over directory", func(p string) error { return os.Mkdir(p, 0o755) }, tree, false},
		{"file over symlink", func(p string) error { return os.Symlink("/etc/passwd", p) }, one, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			target := filepath.Join(parent, "t")
			if err := tc.existing(target); err != nil {
				t.Fatal(err)
			}
			before, _ := os.Lstat(target)
			_, err := Extract(bytes.NewReader(tc.stream), parent, "t", roomy)
			if (err == nil) != tc.ok {
				t.Fatalf("Extract: %v, want ok=%v", err, tc.ok)
			}
			if !tc.ok {
				if !errors.Is(err, fs.ErrExist) {
					t.Errorf("error %v does not wrap fs.ErrExist", err)
				}
				after, _ := os.Lstat(target)
				if after.Mode() != before.Mode() {
					t.Error("the existing destination changed")
				}
			}
			if ents, _ := os.ReadDir(parent); len(ents) != 1 {
				t.Errorf("parent holds %v", names(ents))
			}
		})
	}
}

func TestResolve(t *testing.T) {
	base := t.TempDir()
	existing := filepath.Join(base, "dir")
	if err := os.Mkdir(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dest, parent, name string
		ok                 bool
	}{
		{existing, existing, "top", true},
		{existing + "/new/", existing + "/new/", "top", true},
		{filepath.Join(base, "renamed"), base + "/", "renamed", true},
		{filepath.Join(base, "missing/renamed"), "", "", false},
		{"", "", "", false},
	} {
		p, n, err := Resolve(tc.dest, "top")
		if (err == nil) != tc.ok || p != tc.parent || n != tc.name {
			t.Errorf("Resolve(%q) = %q, %q, %v; want %q, %q, ok=%v", tc.dest, p, n, err, tc.parent, tc.name, tc.ok)
		}
	}
}

func FuzzCheck(f *testing.F) {
	for _, tc := range hostile {
		f.Add(craft(f, tc.entries...))
	}
	f.Add(craft(f, dir("top"), file("top/a", "x"), symlink("top/l", "a")))
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		sum, err := Check(bytes.NewReader(data), &out, roomy)
		if err != nil {
			return
		}
		// Whatever passed passes again, unchanged.
		var again bytes.Buffer
		sum2, err := Check(bytes.NewReader(out.Bytes()), &again, roomy)
		if err != nil || sum2 != sum || !bytes.Equal(again.Bytes(), out.Bytes()) {
			t.Fatalf("a checked stream does not check the same: %v\n%+v\n%+v", err, sum, sum2)
		}
	})
}

// TestPackRefusesAFileSwappedAfterTheWalk: the walk found a regular file;
// what is at its name when Pack opens it is something else. Pack sends
// nothing of it.
func TestPackRefusesAFileSwappedAfterTheWalk(t *testing.T) {
	for _, tc := range []struct {
		name string
		swap func(p, secret string) error
		ok   bool
	}{
		{"unchanged", func(p, secret string) error { return nil }, true},
		{"a symlink", func(p, secret string) error {
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Symlink(secret, p)
		}, false},
		{"another file", func(p, secret string) error {
			tmp := p + ".new"
			if err := os.WriteFile(tmp, []byte("SECRET"), 0o600); err != nil {
				return err
			}
			return os.Rename(tmp, p)
		}, false},
		{"a FIFO", func(p, secret string) error {
			if err := os.Remove(p); err != nil {
				return err
			}
			return mkfifo(p)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			p, secret := filepath.Join(d, "f"), filepath.Join(d, "secret")
			if err := os.WriteFile(p, []byte("plain!"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(secret, []byte("SECRET"), 0o600); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			walked := fs.FileInfoToDirEntry(fi) // the walk's lstat, before the swap
			if err := tc.swap(p, secret); err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			tw := tar.NewWriter(&b)
			err = packEntry(tw, p, "f", walked, newChecker(intoGuest), &fileHash{})
			_ = tw.Flush()
			if tc.ok {
				if err != nil || !bytes.Contains(b.Bytes(), []byte("plain!")) {
					t.Fatalf("packEntry: %v", err)
				}
				return
			}
			if !errors.Is(err, errChanged) {
				t.Errorf("packEntry: %v, want an error wrapping %v", err, errChanged)
			}
			if bytes.Contains(b.Bytes(), []byte("SECRET")) {
				t.Error("the swapped-in content was packed")
			}
		})
	}
}
