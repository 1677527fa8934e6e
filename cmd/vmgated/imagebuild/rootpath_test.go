package imagebuild

import (
	"archive/tar"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestImportThroughLinks: a later layer's entries through symlinks an
// earlier layer made land where the guest finds them. An absolute
// target starts at the image's root, as Debian's /var/run -> /run does;
// one that names a host directory names the root's, and nothing is
// written outside.
func TestImportThroughLinks(t *testing.T) {
	outside := t.TempDir()
	l1 := []tfile{
		{name: "run/", typ: tar.TypeDir},
		{name: "run/old", body: "old"},
		{name: "var/", typ: tar.TypeDir},
		{name: "var/run", typ: tar.TypeSymlink, link: "/run"},
		{name: "var/lock", typ: tar.TypeSymlink, link: "/run/lock"}, // to nothing yet
		{name: "srv/", typ: tar.TypeDir},
		{name: "srv/app", typ: tar.TypeSymlink, link: "../opt/app"}, // relative
		{name: "opt/app/", typ: tar.TypeDir},
		{name: "host", typ: tar.TypeSymlink, link: outside},
		{name: "etc/passwd", body: "root:x:0:0::/root:/bin/sh\n"},
		{name: "etc2", typ: tar.TypeSymlink, link: "/etc/"},
		{name: "hop", typ: tar.TypeSymlink, link: "/var/run/../etc/."}, // .. of /run, where /var/run leads, as the kernel: /etc
	}
	l2 := []tfile{
		{name: "var/run/new", body: "new"},          // into /run
		{name: "var/run/.wh.old"},                   // a whiteout through the link
		{name: "var/lock/x", body: "x"},             // makes /run/lock
		{name: "srv/app/main", body: "main"},        // into /opt/app
		{name: "host/escaped", body: "in the root"}, // the root's copy of the host's path
		{name: "hl", typ: tar.TypeLink, link: "etc2/passwd"},
		{name: "hop/group", body: "root:x:0:\n"},
	}
	img := testImage(t, "amd64", testLayer(t, l1), testLayer(t, l2))
	dir := writeLayout(t, img)
	for _, src := range []string{dir, tarDir(t, dir)} {
		s, err := openSource(t.Context(), src, testLimits)
		if err != nil {
			t.Fatal(err)
		}
		root, err := unpackInto(t, s, testLimits, false)
		if err != nil {
			t.Fatalf("%s: %v", filepath.Base(src), err)
		}
		got := tree(t, root)
		inRoot := strings.TrimPrefix(outside, "/")
		for p, want := range map[string]string{
			"run/new": "file:new", "run/lock/x": "file:x", "opt/app/main": "file:main",
			inRoot + "/escaped": "file:in the root", "hl": "file:root:x:0:0::/root:/bin/sh\n", "etc/group": "file:root:x:0:\n",
			"var/run": "link:/run", "var/lock": "link:/run/lock", "srv/app": "link:../opt/app", "host": "link:" + outside,
		} {
			if got[p] != want {
				t.Errorf("%s: %s is %q, want %q", filepath.Base(src), p, got[p], want)
			}
		}
		if _, ok := got["run/old"]; ok {
			t.Errorf("%s: run/old survived its whiteout through var/run", filepath.Base(src))
		}
		a, errA := os.Stat(filepath.Join(root, "hl"))
		b, errB := os.Stat(filepath.Join(root, "etc/passwd"))
		if errA != nil || errB != nil || !os.SameFile(a, b) {
			t.Errorf("%s: hl is not a hard link of etc/passwd (%v, %v)", filepath.Base(src), errA, errB)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 0 {
			t.Fatalf("written outside the root: %v", ents)
		}
	}
}
