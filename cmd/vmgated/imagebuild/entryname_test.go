package imagebuild

import (
	"errors"
	"path"
	"strings"
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
