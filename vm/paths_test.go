package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/vm/image"
)

// tree makes a directory tree under a new temporary directory from
// entries: "d/" a directory, "name -> target" a symlink, anything else an
// empty file. It returns the tree's root, resolved.
func tree(t *testing.T, entries ...string) string {
	t.Helper()
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		var err error
		switch name, target, link := strings.Cut(e, " -> "); {
		case link:
			err = os.Symlink(strings.ReplaceAll(target, "ROOT", root), filepath.Join(root, name))
		case strings.HasSuffix(e, "/"):
			err = os.MkdirAll(filepath.Join(root, e), 0o755)
		default:
			err = os.WriteFile(filepath.Join(root, e), nil, 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestResolveDir: a directory reached through symlinks (absolute,
// relative, chained, in the middle of the path) resolves to its real
// path; a path that does not lead to a directory is an error that names
// the component at fault and, for a link, its target and the fix.
func TestResolveDir(t *testing.T) {
	root := tree(t, "data/img/", "data/file", "srv/",
		"srv/abs -> ROOT/data/img", "srv/rel -> ../data/img", "srv/chain -> abs", "srv/up -> ../data",
		"srv/dangling -> ROOT/data/img-2026-12", "srv/loop1 -> loop2", "srv/loop2 -> loop1",
		"srv/filelink -> ../data/file")
	img := filepath.Join(root, "data/img")
	for _, tc := range []struct {
		dir, want string
		errHas    []string // the error's text holds each
		notExist  bool     // the error wraps fs.ErrNotExist
	}{
		{dir: img, want: img},
		{dir: root + "/srv/abs", want: img},
		{dir: root + "/srv/rel", want: img},
		{dir: root + "/srv/chain", want: img},
		{dir: root + "/srv/up/img", want: img},
		{dir: root + "/srv/abs/", want: img},
		{dir: root + "/srv/../srv/abs", want: img},
		{dir: root + "/data/nope", errHas: []string{root + "/data/nope does not exist"}, notExist: true},
		{dir: root + "/nope/img", errHas: []string{root + "/nope does not exist (on the path " + root + "/nope/img)"}, notExist: true},
		{dir: root + "/srv/dangling", errHas: []string{root + "/srv/dangling is a symlink to " + root + "/data/img-2026-12, which does not exist",
			"point the link at an existing directory, or give the directory itself"}, notExist: true},
		{dir: root + "/srv/dangling/sub", errHas: []string{root + "/srv/dangling is a symlink to " + root + "/data/img-2026-12, which does not exist"}, notExist: true},
		{dir: root + "/srv/loop1", errHas: []string{root + "/srv/loop1 is a symlink to loop2 in a loop of symlinks"}},
		{dir: root + "/data/file", errHas: []string{root + "/data/file is not a directory"}},
		{dir: root + "/srv/filelink", errHas: []string{root + "/srv/filelink leads to " + root + "/data/file, which is not a directory"}},
		{dir: root + "/data/file/sub", errHas: []string{root + "/data/file is not a directory (on the path " + root + "/data/file/sub)"}},
		{dir: "", errHas: []string{"no directory given"}},
	} {
		got, err := ResolveDir(tc.dir)
		if tc.errHas == nil {
			if err != nil || got != tc.want {
				t.Errorf("ResolveDir(%s) = %q, %v; want %q", tc.dir, got, err, tc.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("ResolveDir(%s) = %q, want an error", tc.dir, got)
			continue
		}
		for _, want := range tc.errHas {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("ResolveDir(%s): %q lacks %q", tc.dir, err, want)
			}
		}
		if errors.Is(err, fs.ErrNotExist) != tc.notExist {
			t.Errorf("ResolveDir(%s): %v: wraps fs.ErrNotExist: %v, want %v", tc.dir, err, !tc.notExist, tc.notExist)
		}
	}

	// A relative path is taken from the working directory.
	t.Chdir(root + "/srv")
	if got, err := ResolveDir("rel"); err != nil || got != img {
		t.Errorf("ResolveDir(rel) = %q, %v; want %q", got, err, img)
	}
}

// TestResolveDir_Unsearchable: a directory on the path that the process
// may not search is named, with the uid that needs the permission.
func TestResolveDir_Unsearchable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root searches every directory")
	}
	root := tree(t, "locked/img/")
	if err := os.Chmod(root+"/locked", 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(root+"/locked", 0o755) })
	_, err := ResolveDir(root + "/locked/img")
	if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "must be allowed to search every directory") {
		t.Fatalf("ResolveDir: %v", err)
	}
}

// fakeImage writes a runnable image of empty files into dir.
func fakeImage(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	empty := sha256.Sum256(nil)
	m := &image.Manifest{Inputs: image.Inputs{BuilderVersion: image.MinBuilderVersion}, Artifacts: map[string]image.Artifact{}}
	for _, n := range []string{image.BaseFile, image.KernelFile, image.InitrdFile} {
		m.Artifacts[n] = image.Artifact{SHA256: hex.EncodeToString(empty[:])}
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := image.WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
}

// TestResolveDirs: a host's state, template, image and images
// directories, each reached through a symlink, are replaced by their real
// paths; the template directory is made when missing; an image directory
// that does not exist is an image not built, with the command that builds
// it, but one behind a dangling link says so instead; a state directory
// whose vms is a link is refused with the fix.
func TestResolveDirs(t *testing.T) {
	root := tree(t, "disk/state/", "disk/tmpl/", "disk/images/", "disk/img/",
		"links/", "links/state -> ../disk/state", "links/tmpl -> ../disk/tmpl", "links/images -> ../disk/images", "links/img -> ../disk/img",
		"links/dangling -> ../disk/img-2026-12")
	fakeImage(t, root+"/disk/img")
	links := root + "/links/"

	c := HostConfig{Runtime: Runtime{StateDir: links + "state", TemplateDir: links + "tmpl"}, ImageDir: links + "img", ImagesDir: links + "images"}
	if err := c.ResolveDirs(); err != nil {
		t.Fatal(err)
	}
	want := HostConfig{Runtime: Runtime{StateDir: root + "/disk/state", TemplateDir: root + "/disk/tmpl"}, ImageDir: root + "/disk/img", ImagesDir: root + "/disk/images"}
	if c.StateDir != want.StateDir || c.TemplateDir != want.TemplateDir || c.ImageDir != want.ImageDir || c.ImagesDir != want.ImagesDir {
		t.Errorf("resolved %+v\nwant %+v", c, want)
	}

	// Defaults: STATE/templates is made, STATE/images is taken as it is
	// until it exists.
	c = HostConfig{Runtime: Runtime{StateDir: links + "state"}, ImageDir: links + "img"}
	if err := c.ResolveDirs(); err != nil {
		t.Fatal(err)
	}
	if c.TemplateDir != root+"/disk/state/templates" || c.ImagesDir != root+"/disk/state/images" {
		t.Errorf("defaults: templates %s, images %s", c.TemplateDir, c.ImagesDir)
	}
	if fi, err := os.Stat(c.TemplateDir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("template directory: %v, %v", fi, err)
	}

	for _, tc := range []struct {
		name    string
		opts    Options
		errHas  string
		noImage bool // wraps image.ErrNotBuilt
	}{
		{"no image", Options{Runtime: Runtime{StateDir: links + "state"}, ImageDir: root + "/disk/nope"},
			"image directory: " + root + "/disk/nope: image not built (run: vmgated image build --out " + root + "/disk/nope)", true},
		{"dangling image link", Options{Runtime: Runtime{StateDir: links + "state"}, ImageDir: links + "dangling"},
			"image directory: " + links + "dangling is a symlink to ../disk/img-2026-12, which does not exist", false},
		{"dangling state link", Options{Runtime: Runtime{StateDir: links + "dangling"}, ImageDir: links + "img"},
			"state directory: " + links + "dangling is a symlink", false},
		{"template directory on a file", Options{Runtime: Runtime{StateDir: links + "state", TemplateDir: root + "/disk/img/manifest.json/t"}, ImageDir: links + "img"},
			"template directory: " + root + "/disk/img/manifest.json is not a directory", false},
	} {
		err := tc.opts.ResolveDirs()
		if err == nil || !strings.Contains(err.Error(), tc.errHas) || errors.Is(err, image.ErrNotBuilt) != tc.noImage {
			t.Errorf("%s: %v, want an error holding %q (image not built: %v)", tc.name, err, tc.errHas, tc.noImage)
		}
	}

	if err := os.Symlink(root+"/disk", root+"/disk/state/vms"); err != nil {
		t.Fatal(err)
	}
	r := Runtime{StateDir: links + "state"}
	if err := r.ResolveDirs(); err == nil || !strings.Contains(err.Error(), "vms is a symlink") || !strings.Contains(err.Error(), "link the state directory itself") {
		t.Errorf("vms a symlink: %v", err)
	}
}

// TestHost_UseImages: the daemon's reload points an image name at the
// directory its link leads to now: the Host checks it there, serves that
// directory from then on, with the default image's digest read anew, and
// replaces the shapes of the moved image only (dropped, and warmed again
// from the new directory); a directory that fails its check changes
// nothing.
func TestHost_UseImages(t *testing.T) {
	root := tree(t, "a/", "b/", "ml/", "bad/", "state/")
	for _, d := range []string{"a", "b", "ml"} {
		fakeImage(t, root+"/"+d)
	}
	ctx, cancel := context.WithCancel(t.Context())
	h := &Host{cfg: HostConfig{Runtime: Runtime{StateDir: root + "/state", Accel: AccelTCG}, ImageDir: root + "/a", ImagesDir: root + "/images"},
		images: map[string]string{DefaultImage: root + "/a"}, digest: "old", log: slog.New(slog.DiscardHandler),
		ctx: ctx, cancel: cancel, building: make(chan struct{}, 1), shapes: map[Shape]*shapeEntry{}}
	t.Cleanup(func() { cancel(); h.wg.Wait() }) // the warm-ups fail at once: the images are empty files
	// Two shapes still loading (not ready): one of each image.
	def, ml := Shape{Image: DefaultImage, MemoryMiB: 512, CPUs: 1}.normal(), Shape{Image: "ml", MemoryMiB: 512, CPUs: 1}.normal()
	oldDef, oldML := &shapeEntry{}, &shapeEntry{}
	h.shapes[def], h.shapes[ml] = oldDef, oldML
	entry := func(k Shape) *shapeEntry {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.shapes[k]
	}

	moves, err := h.UseImages(map[string]string{DefaultImage: root + "/a", "ml": root + "/ml"})
	if err != nil || len(moves) != 1 || moves[0] != (ImageMove{Name: "ml", From: root + "/images/ml", To: root + "/ml"}) {
		t.Fatalf("first use of ml: %+v, %v", moves, err)
	}
	if d, _ := h.ImageDir("ml"); d != root+"/ml" {
		t.Errorf("ml's directory: %s", d)
	}
	if entry(def) != oldDef || entry(ml) == oldML || entry(ml) == nil {
		t.Errorf("after ml moved: the default image's shape %p (was %p), ml's %p (was %p): want the first kept, the second new", entry(def), oldDef, entry(ml), oldML)
	}

	if _, err := h.UseImages(map[string]string{DefaultImage: root + "/bad"}); err == nil || !strings.Contains(err.Error(), root+"/bad") {
		t.Fatalf("an unbuilt image: %v", err)
	}
	if d, _ := h.ImageDir(DefaultImage); d != root+"/a" || h.ImageDigest() != "old" || entry(def) != oldDef {
		t.Fatalf("a failed check changed the default image: %s, digest %s", d, h.ImageDigest())
	}

	moves, err = h.UseImages(map[string]string{DefaultImage: root + "/b", "ml": root + "/ml"})
	if err != nil || len(moves) != 1 || moves[0] != (ImageMove{Name: DefaultImage, From: root + "/a", To: root + "/b"}) {
		t.Fatalf("the default image's move: %+v, %v", moves, err)
	}
	empty := sha256.Sum256(nil)
	if d, _ := h.ImageDir(""); d != root+"/b" || h.ImageDigest() != hex.EncodeToString(empty[:]) || h.ImageDigestOf(DefaultImage) != h.ImageDigest() {
		t.Errorf("default image after its move: %s, digest %s", d, h.ImageDigest())
	}
	if entry(def) == oldDef || entry(def) == nil {
		t.Error("the default image's shape was not replaced after its move")
	}
}
