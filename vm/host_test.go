package vm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/vm/image"
)

// TestShapeNormal: a shape that leaves its image unnamed and one that
// names the default image are one shape (one template, one pool): the
// daemon warms the first and requests ask for the second.
func TestShapeNormal(t *testing.T) {
	a := Shape{MemoryMiB: 512, CPUs: 1}.normal()
	b := Shape{Image: DefaultImage, MemoryMiB: 512, CPUs: 1}.normal()
	if a != b {
		t.Fatalf("%+v and %+v are different shapes", a, b)
	}
	if c := (Shape{Image: "ml", MemoryMiB: 512, CPUs: 1}).normal(); c == a {
		t.Fatal("another image is the same shape")
	}
}

// TestHost_GetRefusesBadImageName: a shape naming no valid image is an
// error, never the default image in its place.
func TestHost_GetRefusesBadImageName(t *testing.T) {
	h := &Host{cfg: HostConfig{Runtime: Runtime{StateDir: t.TempDir()}, ImageDir: "/nonexistent/default"}}
	for _, name := range []string{"../x", "a/b", ".hidden"} {
		if _, _, err := h.Get(t.Context(), Shape{Image: name}); err == nil {
			t.Errorf("Get with image %q: no error", name)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		failures int
		want     time.Duration
	}{{1, 30 * time.Second}, {2, time.Minute}, {3, 2 * time.Minute}, {5, 8 * time.Minute}, {6, 10 * time.Minute}, {40, 10 * time.Minute}} {
		if got := retryAfter(tc.failures); got != tc.want {
			t.Errorf("retryAfter(%d) = %v, want %v", tc.failures, got, tc.want)
		}
	}
}

// TestNewHostRefusesStaleImage: a daemon whose image's agent speaks the
// old protocol does not start, and says how to rebuild the image; the
// same for an image a policy names.
func TestNewHostRefusesStaleImage(t *testing.T) {
	dir := t.TempDir()
	m := &image.Manifest{Inputs: image.Inputs{BuilderVersion: image.MinBuilderVersion - 1}, Artifacts: map[string]image.Artifact{}}
	for _, n := range []string{image.BaseFile, image.KernelFile, image.InitrdFile} {
		m.Artifacts[n] = image.Artifact{}
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := image.WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	_, err := NewHost(HostConfig{Runtime: Runtime{StateDir: t.TempDir()}, ImageDir: dir, Cgroups: "off"})
	if !errors.Is(err, image.ErrStale) || !strings.Contains(err.Error(), "vmgated image build --out "+dir) {
		t.Fatalf("NewHost: %v, want ErrStale saying how to rebuild", err)
	}
	images := t.TempDir()
	if err := os.Symlink(dir, filepath.Join(images, "old")); err != nil {
		t.Fatal(err)
	}
	h := &Host{cfg: HostConfig{ImageDir: dir, ImagesDir: images}}
	if err := h.CheckImage("old"); !errors.Is(err, image.ErrStale) {
		t.Fatalf("CheckImage: %v, want ErrStale", err)
	}
}

// TestHost_ImageDigestOfReadsEachManifestOnce: the digest of a named image
// (asked for by every exec's audit record) is read from its manifest
// once, and again only when the manifest has changed: replaced, as an
// image build or import does, or rewritten in place; a manifest that is
// gone gives "". The daemon's own image needs no read at all.
func TestHost_ImageDigestOfReadsEachManifestOnce(t *testing.T) {
	images := t.TempDir()
	dir := filepath.Join(images, "ml")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(digest string) {
		t.Helper()
		m := &image.Manifest{Artifacts: map[string]image.Artifact{image.BaseFile: {SHA256: digest}, image.KernelFile: {}, image.InitrdFile: {}}}
		if err := image.WriteManifest(dir, m); err != nil {
			t.Fatal(err)
		}
	}
	reads := 0
	h := &Host{cfg: HostConfig{ImageDir: t.TempDir(), ImagesDir: images}, digest: "default-digest",
		readManifest: func(dir string) (*image.Manifest, error) {
			reads++
			return image.ReadManifest(dir)
		}}
	check := func(step, want string, wantReads int) {
		t.Helper()
		if got := h.ImageDigestOf("ml"); got != want || reads != wantReads {
			t.Errorf("%s: digest %q after %d manifest reads, want %q after %d", step, got, reads, want, wantReads)
		}
	}
	write("aaaa")
	check("first", "aaaa", 1)
	for range 100 {
		check("unchanged", "aaaa", 1)
	}
	write("bbbb") // a new file renamed over the old one
	check("replaced", "bbbb", 2)
	check("replaced, again", "bbbb", 2)

	// Rewritten in place with the same size (an editor's save): its
	// time stamps tell.
	p := filepath.Join(dir, image.ManifestFile)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(strings.Replace(string(b), "bbbb", "cccc", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(p, later, later); err != nil {
		t.Fatal(err)
	}
	check("rewritten in place", "cccc", 3)

	// A check (the daemon's reload) reads the image afresh.
	_ = h.CheckImage("ml")
	check("after CheckImage", "cccc", 4)

	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	check("gone", "", 4)
	write("dddd")
	check("back", "dddd", 5)

	if got := h.ImageDigestOf(DefaultImage); got != "default-digest" || reads != 5 {
		t.Errorf("the default image: %q after %d reads", got, reads)
	}
}

func TestHostConfigImageDirOf(t *testing.T) {
	c := HostConfig{Runtime: Runtime{StateDir: "/state"}, ImageDir: "/img"}
	for name, want := range map[string]string{"": "/img", DefaultImage: "/img", "web": "/state/images/web"} {
		if got, err := c.ImageDirOf(name); err != nil || got != want {
			t.Errorf("ImageDirOf(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	c.ImagesDir = "/other"
	if got, _ := c.ImageDirOf("web"); got != "/other/web" {
		t.Errorf("with ImagesDir: %q", got)
	}
	if _, err := c.ImageDirOf("../x"); err == nil {
		t.Error("a path was taken for an image name")
	}
}

// TestHost_ImageSourceOf: an image's source (its configuration) is read
// from its manifest as its digest is, once per version of the manifest;
// a built image has none.
func TestHost_ImageSourceOf(t *testing.T) {
	images := t.TempDir()
	dir := filepath.Join(images, "py")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(src *image.Source) {
		t.Helper()
		m := &image.Manifest{Artifacts: map[string]image.Artifact{image.BaseFile: {SHA256: "aaaa"}, image.KernelFile: {}, image.InitrdFile: {}}, Source: src}
		if err := image.WriteManifest(dir, m); err != nil {
			t.Fatal(err)
		}
	}
	reads := 0
	h := &Host{cfg: HostConfig{ImageDir: t.TempDir(), ImagesDir: images}, digest: "default-digest",
		readManifest: func(dir string) (*image.Manifest, error) {
			reads++
			return image.ReadManifest(dir)
		}}
	write(nil)
	if src := h.ImageSourceOf("py"); src != nil {
		t.Errorf("a built image's source: %+v", src)
	}
	write(&image.Source{Kind: image.SourceRegistry, ManifestDigest: "sha256:ab", WorkingDir: "/srv"})
	for range 3 {
		if src := h.ImageSourceOf("py"); src == nil || src.ManifestDigest != "sha256:ab" || src.WorkingDir != "/srv" {
			t.Errorf("an imported image's source: %+v", src)
		}
	}
	if d := h.ImageDigestOf("py"); d != "aaaa" || reads != 2 {
		t.Errorf("digest %q after %d reads, want aaaa after 2", d, reads)
	}
	if src := h.ImageSourceOf("gone"); src != nil {
		t.Errorf("an image that is not there: %+v", src)
	}
}
