package imagebuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

var layerEntryCases = []struct {
	name  string
	layer bool
	kind  entryKind
	path  string
	bad   bool
}{
	{"etc/passwd", true, entryFile, "etc/passwd", false},
	{"./etc//passwd", true, entryFile, "etc/passwd", false},
	{"./", true, entryFile, ".", false},
	{"usr/bin/", true, entryFile, "usr/bin", false},
	{"etc/.wh.passwd", true, entryWhiteout, "etc/passwd", false},
	{".wh.etc", true, entryWhiteout, "etc", false},
	{"./.wh.etc", true, entryWhiteout, "etc", false},
	{"etc/.wh.passwd", false, entryFile, "etc/.wh.passwd", false}, // a root tarball has no whiteouts
	{"var/.wh..wh..opq", true, entryOpaque, "var", false},
	{".wh..wh..opq", true, entryOpaque, ".", false},
	{".wh..wh.plnk/123.456", true, entrySkip, ".wh..wh.plnk/123.456", false},
	{".wh..wh.aufs", true, entrySkip, ".wh..wh.aufs", false},
	{"a/.wh.", true, entryFile, "", true},
	{"a/.wh...", true, entryFile, "", true},
	{"a/.wh..", true, entryFile, "", true},
	{"../etc/passwd", true, entryFile, "", true},
	{"a/../../etc", true, entryFile, "", true},
	{"a/..", false, entryFile, "", true},
	{"/etc/passwd", true, entryFile, "", true},
	{"", true, entryFile, "", true},
	{"a\x00b", true, entryFile, "", true},
	{"a/...", true, entryFile, "a/...", false}, // a name, not a parent
	{"a/.wh.../b", true, entryFile, "a/.wh.../b", false},
}

func TestLayerEntry(t *testing.T) {
	for _, tc := range layerEntryCases {
		kind, p, err := layerEntry(tc.name, tc.layer)
		if tc.bad {
			if !errors.Is(err, errBadName) {
				t.Errorf("layerEntry(%q): %v, %q, %v; want errBadName", tc.name, kind, p, err)
			}
			continue
		}
		if err != nil || kind != tc.kind || p != tc.path {
			t.Errorf("layerEntry(%q, %v) = %v, %q, %v; want %v, %q", tc.name, tc.layer, kind, p, err, tc.kind, tc.path)
		}
	}
}

// FuzzLayerEntry: whatever a layer names its entries, what the unpacker
// acts on is a clean relative path inside the root (no "..", not
// absolute), or the name is refused.
func FuzzLayerEntry(f *testing.F) {
	for _, tc := range layerEntryCases {
		f.Add(tc.name, tc.layer)
	}
	f.Fuzz(func(t *testing.T, name string, layer bool) {
		kind, p, err := layerEntry(name, layer)
		if err != nil {
			if !errors.Is(err, errBadName) {
				t.Fatalf("%q: an error not errBadName: %v", name, err)
			}
			return
		}
		if p == "" || path.IsAbs(p) || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") {
			t.Fatalf("%q: path %q is not clean and inside the root", name, p)
		}
		if kind == entryWhiteout && p == "." {
			t.Fatalf("%q: a whiteout of the root", name)
		}
		if !layer && kind != entryFile {
			t.Fatalf("%q: kind %v in a root file system tarball", name, kind)
		}
	})
}

var archiveMemberCases = []struct {
	name   string
	marker string
	ok     bool
}{
	{"oci-layout", "oci-layout", true},
	{"./manifest.json", "manifest.json", true},
	{"index.json", "", true},
	{"blobs/", "", true},
	{"blobs/sha256/", "", true},
	{"blobs/sha256/0123abcd", "", true},
	{"repositories", "", true},
	{strings.Repeat("ab", 32) + "/layer.tar", "", true},
	{strings.Repeat("ab", 32) + ".json", "", true},
	{strings.Repeat("ab", 32) + ".tar.gz", "", true},
	{"sha256:" + strings.Repeat("ab", 32), "", true},
	{"./", "", true},
	{"etc/passwd", "", false},
	{"bin", "", false},
	{"blobs/sha256/x/y", "", false},
	{"manifest.json/x", "", false},
}

func TestArchiveMember(t *testing.T) {
	for _, tc := range archiveMemberCases {
		if marker, ok := archiveMember(tc.name); marker != tc.marker || ok != tc.ok {
			t.Errorf("archiveMember(%q) = %q, %v; want %q, %v", tc.name, marker, ok, tc.marker, tc.ok)
		}
	}
}

// FuzzUnpackLayers: whatever two layers hold (names, types, link
// targets, whiteouts; "OUT" stands for a directory beside the root),
// unpacking them writes nothing outside the root and makes no device
// node, whether it fails or not. Each line of a layer is
// "TYPE NAME [TARGET]"; layers are split by "--".
func FuzzUnpackLayers(f *testing.F) {
	f.Add("l out OUT\n--\nf out/x")
	f.Add("l up ../../OUT\nf up/x")
	f.Add("h shadow ../OUT/secret")
	f.Add("l e OUT\n--\nh s e/secret\nf .wh.e")
	f.Add("d d\nf d/a\n--\nf d/.wh..wh..opq\nf d/b\nf .wh.d")
	f.Add("c dev/null\nb dev/sda\np fifo\nf /abs\nf ../up")
	f.Fuzz(func(t *testing.T, spec string) {
		parent := t.TempDir()
		outside := filepath.Join(parent, "OUT")
		root := filepath.Join(parent, "root")
		for _, d := range []string{outside, root} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o600); err != nil {
			t.Fatal(err)
		}
		u, err := newUnpacker(root, unpackOptions{lim: unpackLimits{bytes: 1 << 20, entries: 100}, log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer u.close()
		for layer := range strings.SplitSeq(spec, "--") {
			b, ok := fuzzLayer(strings.ReplaceAll(layer, "OUT", outside))
			if !ok {
				return
			}
			if u.apply(t.Context(), bytes.NewReader(b), true) != nil {
				break
			}
		}
		ents, _ := os.ReadDir(outside)
		if len(ents) != 1 || ents[0].Name() != "secret" {
			t.Fatalf("written outside the root: %v", ents)
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s" {
			t.Fatalf("a file outside the root changed: %q", b)
		}
		if fi, _ := os.Stat(filepath.Join(outside, "secret")); fi.Sys().(*syscall.Stat_t).Nlink != 1 {
			t.Fatal("a file outside the root got a hard link")
		}
		if ents, _ := os.ReadDir(parent); len(ents) != 2 {
			t.Fatalf("written beside the root: %v", ents)
		}
		_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type()&(fs.ModeDevice|fs.ModeNamedPipe) != 0 {
				t.Fatalf("%s is a device or FIFO", p)
			}
			return nil
		})
	})
}

// fuzzLayer writes a layer's tar from its lines (FuzzUnpackLayers).
func fuzzLayer(spec string) ([]byte, bool) {
	types := map[string]byte{"f": tar.TypeReg, "d": tar.TypeDir, "l": tar.TypeSymlink, "h": tar.TypeLink,
		"c": tar.TypeChar, "b": tar.TypeBlock, "p": tar.TypeFifo}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for line := range strings.Lines(spec) {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		typ, ok := types[f[0]]
		if !ok {
			continue
		}
		h := &tar.Header{Name: f[1], Typeflag: typ, Mode: 0o755, Format: tar.FormatPAX}
		if len(f) > 2 {
			h.Linkname = f[2]
		}
		if typ == tar.TypeReg {
			h.Size = 1
		}
		if tw.WriteHeader(h) != nil {
			return nil, false
		}
		if typ == tar.TypeReg {
			_, _ = tw.Write([]byte("x"))
		}
	}
	if tw.Close() != nil {
		return nil, false
	}
	return buf.Bytes(), true
}
