package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/vmgate/vmgate/vm/image"
)

// tfile is one entry of a test layer.
type tfile struct {
	name string
	typ  byte   // tar.TypeReg when 0
	body string // a regular file's
	link string // a link's target
	mode int64
}

// layerTar writes entries as a tar stream.
func layerTar(t *testing.T, entries []tfile) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Typeflag == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// testLayer is a gzip layer of entries.
func testLayer(t *testing.T, entries []tfile) v1.Layer {
	t.Helper()
	b := layerTar(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is an OCI image of the layers, for linux/amd64 (or arch).
func testImage(t *testing.T, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", arch
	cfg.Config.Env = []string{"PATH=/bin:/usr/bin", "GREETING=hello"}
	cfg.Config.WorkingDir = "/work"
	cfg.Config.User = "1000:1000"
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}

// busyboxLayer is a BusyBox root: the host's static busybox, its sh and
// ls, and account files.
func busyboxLayer(t *testing.T) []tfile {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("busybox (Debian: busybox-static) is needed to make a root file system")
	}
	bin, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	return []tfile{
		{name: "bin/", typ: tar.TypeDir},
		{name: "bin/busybox", body: string(bin), mode: 0o755},
		{name: "bin/sh", typ: tar.TypeSymlink, link: "busybox"},
		{name: "bin/ls", typ: tar.TypeSymlink, link: "/bin/busybox"},
		{name: "etc/", typ: tar.TypeDir},
		{name: "etc/passwd", body: "root:x:0:0:root:/root:/bin/sh\n"},
		{name: "etc/gone", body: "deleted by layer 2"},
		{name: "a/x", body: "x1"},
		{name: "a/y", body: "y1"},
		{name: "d/old", body: "old"},
		{name: "d/sub/deep", body: "deep"},
		{name: "keep", body: "v1"},
		{name: "r/inner", body: "in a directory that becomes a file"},
		{name: "f", body: "a file that becomes a directory"},
		{name: "bin/su", body: "set-id", mode: 0o4755},
	}
}

// multiLayerImage is a BusyBox root and two layers that delete and
// replace its files and directories; want is the tree they make.
func multiLayerImage(t *testing.T) (v1.Image, map[string]string) {
	t.Helper()
	l1 := busyboxLayer(t)
	l2 := []tfile{
		{name: "etc/.wh.gone"},                   // a file deleted
		{name: "a/.wh.x"},                        // a file in a directory deleted
		{name: "d/.wh..wh..opq"},                 // an opaque directory: old and sub go
		{name: "d/new", body: "new in layer 2"},  // and the layer's own file stays
		{name: "keep", body: "v2"},               // a file replaced
		{name: "r", body: "now a file"},          // a directory replaced by a file
		{name: "f/", typ: tar.TypeDir},           // a file replaced by a directory
		{name: "f/inner", body: "in"},            //
		{name: ".wh.nothing"},                    // a whiteout of nothing
		{name: ".wh..wh.plnk/1.2", body: "aufs"}, // aufs's bookkeeping: skipped
	}
	l3 := []tfile{
		{name: "d/new2", body: "n2"},      // written before the marker:
		{name: "d/.wh..wh..opq"},          // the layer's own stays, layer 2's d/new goes
		{name: "a/z", body: "z"},          // a whiteout of the layer's own file
		{name: "a/.wh.z"},                 // does nothing
		{name: ".wh.r"},                   // layer 2's file r deleted
		{name: "n/.wh..wh..opq"},          // an opaque directory no layer below has: made
		{name: "work/", typ: tar.TypeDir}, //
		{name: "etc/passwd-link", typ: tar.TypeLink, link: "etc/passwd"},
	}
	img := testImage(t, "amd64", testLayer(t, l1), testLayer(t, l2), testLayer(t, l3))
	want := map[string]string{
		"bin": "dir", "bin/busybox": "file:" + l1[1].body, "bin/sh": "link:busybox", "bin/ls": "link:/bin/busybox",
		"bin/su": "file:set-id",
		"etc":    "dir", "etc/passwd": "file:root:x:0:0:root:/root:/bin/sh\n", "etc/passwd-link": "file:root:x:0:0:root:/root:/bin/sh\n",
		"a": "dir", "a/y": "file:y1", "a/z": "file:z",
		"d": "dir", "d/new2": "file:n2",
		"keep": "file:v2",
		"f":    "dir", "f/inner": "file:in",
		"work": "dir",
		"n":    "dir",
	}
	return img, want
}

// tree lists root as path -> "dir", "link:TARGET" or "file:CONTENT".
func tree(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			out[rel] = "link:" + l
		case d.IsDir():
			out[rel] = "dir"
		default:
			b, _ := os.ReadFile(p)
			out[rel] = "file:" + string(b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeLayout writes img as an OCI image layout in a new directory, in
// an index of platforms as a registry's (with others beside it).
func writeLayout(t *testing.T, img v1.Image, others ...v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, o := range others {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: o, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	}
	if img != nil {
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &Platform}})
	}
	if err := p.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarDir writes the directory as a tar file.
func tarDir(t *testing.T, dir string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), filepath.Base(dir)+".tar")
	if b, err := exec.Command("tar", "-C", dir, "-cf", out, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, b)
	}
	return out
}

// dockerSave writes img as a docker save archive.
func dockerSave(t *testing.T, img v1.Image) string {
	t.Helper()
	tag, err := name.NewTag("vmgate-test/multi:1")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "save.tar")
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// unpackInto unpacks src into a new directory.
func unpackInto(t *testing.T, src *imageSource, lim unpackLimits, keepSetid bool) (string, error) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	opt := testOpts(lim)
	opt.keepSetid = keepSetid
	u, err := newUnpacker(root, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer u.close()
	return root, src.unpack(t.Context(), u)
}

func digestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func configDigestOf(t *testing.T, img v1.Image) string {
	t.Helper()
	d, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// TestImportImageKinds: a multi-layer image over a BusyBox root, as an
// OCI layout directory, its tar and a docker save archive, unpacks to
// the same tree (whiteouts and opaque directories applied as a runtime
// would), and the source records its digests, platform and
// configuration.
func TestImportImageKinds(t *testing.T) {
	img, want := multiLayerImage(t)
	other := testImage(t, "arm64", testLayer(t, []tfile{{name: "arm", body: "arm"}}))
	dir := writeLayout(t, img, other)
	wantSource := image.Source{ConfigDigest: configDigestOf(t, img), Platform: "linux/amd64",
		Env: []string{"PATH=/bin:/usr/bin", "GREETING=hello"}, WorkingDir: "/work", User: "1000:1000"}
	for _, tc := range []struct {
		name, src, kind string
		manifest        bool
	}{
		{"layout directory", dir, image.SourceLayout, true},
		{"layout tar", tarDir(t, dir), image.SourceLayout, true},
		{"docker save", dockerSave(t, img), image.SourceArchive, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := openSource(t.Context(), tc.src, testLimits)
			if err != nil {
				t.Fatal(err)
			}
			ws := wantSource
			ws.Kind, ws.Reference = tc.kind, tc.src
			if tc.manifest {
				ws.ManifestDigest = digestOf(t, img)
			}
			if !reflect.DeepEqual(src.source, ws) {
				t.Errorf("source:\n%+v\nwant\n%+v", src.source, ws)
			}
			if src.digest != ws.ConfigDigest {
				t.Errorf("digest %s, want the configuration's %s", src.digest, ws.ConfigDigest)
			}
			root, err := unpackInto(t, src, testLimits, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := tree(t, root); !reflect.DeepEqual(got, want) {
				t.Errorf("tree:\n%v\nwant\n%v", brief(got), brief(want))
			}
			a, _ := os.Stat(filepath.Join(root, "etc/passwd"))
			b, _ := os.Stat(filepath.Join(root, "etc/passwd-link"))
			if !os.SameFile(a, b) {
				t.Error("etc/passwd-link is not a hard link of etc/passwd")
			}
			if fi, err := os.Stat(filepath.Join(root, "bin/su")); err != nil {
				t.Error(err)
			} else if fi.Mode() != 0o755 {
				t.Errorf("bin/su: %v, want its set-user-ID bit cleared", fi.Mode())
			}
		})
	}
	// A root file system tarball is still one.
	src, err := openSource(t.Context(), busyboxTarball(t, "gzip"), testLimits)
	if err != nil || src.source.Kind != image.SourceRootFS || !strings.HasPrefix(src.digest, "sha256:") {
		t.Errorf("a root file system tarball: %+v, %v", src, err)
	}
}

// brief shortens file contents (busybox's) for a message.
func brief(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = v[:min(len(v), 40)]
	}
	return out
}

// layoutBlob is the path of a layout's blob.
func layoutBlob(t *testing.T, dir string, h v1.Hash) string {
	return filepath.Join(dir, "blobs", h.Algorithm, h.Hex)
}

// TestImportBadImages: an image that is not what it says, or that
// would reach out of its root, or is over the bounds, is refused with an
// error that says so, and writes nothing outside the scratch root.
func TestImportBadImages(t *testing.T) {
	outside := t.TempDir()
	good := testImage(t, "amd64", testLayer(t, []tfile{{name: "etc/passwd", body: "root:x:0:0::/:/bin/sh\n"}}),
		testLayer(t, []tfile{{name: "etc/hostname", body: "x"}}))
	layers, err := good.Layers()
	if err != nil {
		t.Fatal(err)
	}
	second, _ := layers[1].Digest()
	write := func(t *testing.T, b []byte) func(string) {
		return func(p string) {
			if err := os.WriteFile(p, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	otherGz := layerTarGz(t, []tfile{{name: "etc/hostname", body: "not the layer the manifest names"}})

	one := func(entries ...tfile) v1.Image { return testImage(t, "amd64", testLayer(t, entries)) }
	two := func(a, b []tfile) v1.Image { return testImage(t, "amd64", testLayer(t, a), testLayer(t, b)) }
	for _, tc := range []struct {
		name   string
		layout func(t *testing.T) string
		lim    unpackLimits
		want   error
		text   string
	}{
		{"a layer whose digest does not match its descriptor", func(t *testing.T) string {
			dir := writeLayout(t, good)
			write(t, otherGz)(layoutBlob(t, dir, second))
			return dir
		}, testLimits, ErrDigest, "does not match its digest"},
		{"a truncated layer", func(t *testing.T) string {
			dir := writeLayout(t, good)
			p := layoutBlob(t, dir, second)
			b, _ := os.ReadFile(p)
			write(t, b[:len(b)/2])(p)
			return dir
		}, testLimits, ErrDigest, "(truncated?)"},
		{"an unknown layer media type", func(t *testing.T) string {
			img := testImage(t, "amd64", static.NewLayer([]byte("x"), "application/vnd.example.unknown"))
			return writeLayout(t, img)
		}, testLimits, ErrMediaType, "application/vnd.example.unknown"},
		{"an unknown manifest media type", func(t *testing.T) string {
			dir := writeLayout(t, good)
			idx := fmt.Sprintf(`{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.example.manifest","digest":%q,"size":2,"platform":{"os":"linux","architecture":"amd64"}}]}`, second)
			write(t, []byte(idx))(filepath.Join(dir, "index.json"))
			return dir
		}, testLimits, ErrMediaType, "application/vnd.example.manifest"},
		{"a name with ..", func(t *testing.T) string {
			return writeLayout(t, one(tfile{name: "../" + filepath.Base(outside) + "/escaped", body: "x"}))
		}, testLimits, errBadName, `has a ".." element`},
		{"an absolute name", func(t *testing.T) string {
			return writeLayout(t, one(tfile{name: outside + "/escaped", body: "x"}))
		}, testLimits, errBadName, "is absolute"},
		{"a symlink of one layer leading the next out of the root", func(t *testing.T) string {
			return writeLayout(t, two([]tfile{{name: "out", typ: tar.TypeSymlink, link: "../../../../../../../../" + outside}}, []tfile{{name: "out/escaped", body: "x"}}))
		}, testLimits, errLinkOut, "out of the root"},
		{"a relative symlink leading out", func(t *testing.T) string {
			return writeLayout(t, one(tfile{name: "up", typ: tar.TypeSymlink, link: "../../../../../../../../" + outside}, tfile{name: "up/escaped", body: "x"}))
		}, testLimits, errLinkOut, "out of the root"},
		{"a symlink below the root that climbs out of it", func(t *testing.T) string {
			return writeLayout(t, one(tfile{name: "a/b/", typ: tar.TypeDir}, tfile{name: "a/b/up", typ: tar.TypeSymlink, link: "../../../" + filepath.Base(outside)},
				tfile{name: "a/b/up/escaped", body: "x"}))
		}, testLimits, errLinkOut, "out of the root"},
		{"a symlink loop", func(t *testing.T) string {
			return writeLayout(t, two([]tfile{{name: "p", typ: tar.TypeSymlink, link: "q"}, {name: "q", typ: tar.TypeSymlink, link: "/p"}}, []tfile{{name: "p/x", body: "x"}}))
		}, testLimits, nil, "more than 40 symlinks"},
		{"a hard link to outside", func(t *testing.T) string {
			return writeLayout(t, one(tfile{name: "shadow", typ: tar.TypeLink, link: "../../../../etc/shadow"}))
		}, testLimits, errBadName, "hard link"},
		{"a hard link through a symlink to outside", func(t *testing.T) string {
			return writeLayout(t, two([]tfile{{name: "etc2", typ: tar.TypeSymlink, link: "../../../../../../../etc"}}, []tfile{{name: "shadow", typ: tar.TypeLink, link: "etc2/shadow"}}))
		}, testLimits, errLinkOut, "out of the root"},
		{"a hard link through an absolute symlink is the root's, not the host's", func(t *testing.T) string {
			return writeLayout(t, two([]tfile{{name: "etc2", typ: tar.TypeSymlink, link: "/etc"}}, []tfile{{name: "shadow", typ: tar.TypeLink, link: "etc2/shadow"}}))
		}, testLimits, fs.ErrNotExist, "etc/shadow"},
		{"a layer over the byte bound", func(t *testing.T) string {
			return writeLayout(t, one(tfile{name: "big", body: strings.Repeat("x", 2<<20)}))
		}, unpackLimits{bytes: 1 << 20, entries: 100}, errTooLarge, "more than 1 MiB"},
		{"an image over the entry bound (over its layers)", func(t *testing.T) string {
			return writeLayout(t, two([]tfile{{name: "a"}, {name: "b"}, {name: "c"}}, []tfile{{name: "d"}, {name: "e"}}))
		}, unpackLimits{bytes: 1 << 20, entries: 4}, errTooLarge, "more than 4 entries"},
		{"an index without linux/amd64", func(t *testing.T) string {
			return writeLayout(t, nil, testImage(t, "arm64", testLayer(t, []tfile{{name: "a"}})))
		}, testLimits, ErrNoPlatform, "linux/arm64"},
		{"an image whose configuration is not linux/amd64", func(t *testing.T) string {
			dir := filepath.Join(t.TempDir(), "layout")
			p, err := layout.Write(dir, empty.Index)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.AppendImage(testImage(t, "riscv64", testLayer(t, []tfile{{name: "a"}}))); err != nil {
				t.Fatal(err)
			}
			return dir
		}, testLimits, ErrNoPlatform, "linux/riscv64"},
		{"a manifest list loop", func(t *testing.T) string {
			// An index that lists itself: content addressing makes it a
			// lie, found out by the digest.
			dir := writeLayout(t, good)
			loop := v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
			idx := fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.index.v1+json","digest":%q,"size":%d,"platform":{"os":"linux","architecture":"amd64"}}]}`, loop, 0)
			body := strings.Replace(idx, `"size":0`, fmt.Sprintf(`"size":%d`, len(idx)), 1)
			write(t, []byte(body))(layoutBlob(t, dir, loop))
			write(t, []byte(body))(filepath.Join(dir, "index.json"))
			return dir
		}, testLimits, ErrDigest, "does not match its digest"},
		{"indexes nested deeper than the bound", func(t *testing.T) string {
			var idx v1.ImageIndex = mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
				mutate.IndexAddendum{Add: good, Descriptor: v1.Descriptor{Platform: &Platform}})
			for range maxIndexDepth {
				idx = mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex),
					mutate.IndexAddendum{Add: idx, Descriptor: v1.Descriptor{Platform: &Platform}})
			}
			dir := filepath.Join(t.TempDir(), "layout")
			if _, err := layout.Write(dir, idx); err != nil {
				t.Fatal(err)
			}
			return dir
		}, testLimits, nil, "more than 4 indexes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tc.layout(t)
			for _, src := range []string{dir, tarDir(t, dir)} {
				s, err := openSource(t.Context(), src, tc.lim)
				if err == nil {
					_, err = unpackInto(t, s, tc.lim, false)
				}
				if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.text) {
					t.Errorf("%s: %v; want %v with %q", filepath.Base(src), err, tc.want, tc.text)
				}
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("written outside the root: %v", ents)
			}
		})
	}
}

// TestImportDeviceNodes: device nodes and FIFOs are skipped (never made
// on the host: the guest's /dev is its kernel's); the rest unpacks.
func TestImportDeviceNodes(t *testing.T) {
	img := testImage(t, "amd64", testLayer(t, []tfile{
		{name: "dev/", typ: tar.TypeDir},
		{name: "dev/null", typ: tar.TypeChar, mode: 0o666},
		{name: "dev/sda", typ: tar.TypeBlock, mode: 0o666},
		{name: "run/fifo", typ: tar.TypeFifo},
		{name: "etc/ok", body: "ok"},
	}))
	src, err := openSource(t.Context(), writeLayout(t, img), testLimits)
	if err != nil {
		t.Fatal(err)
	}
	root, err := unpackInto(t, src, testLimits, false)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"dev": "dir", "etc": "dir", "etc/ok": "file:ok"}
	if got := tree(t, root); !reflect.DeepEqual(got, want) {
		t.Errorf("tree %v, want %v", got, want)
	}
}

// TestKeepSetid: with keepSetid the image's set-id bits stay.
func TestKeepSetid(t *testing.T) {
	img := testImage(t, "amd64", testLayer(t, []tfile{{name: "su", body: "x", mode: 0o4755}, {name: "wall", body: "x", mode: 0o2755}}))
	src, err := openSource(t.Context(), writeLayout(t, img), testLimits)
	if err != nil {
		t.Fatal(err)
	}
	root, err := unpackInto(t, src, testLimits, true)
	if err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{"su": os.ModeSetuid | 0o755, "wall": os.ModeSetgid | 0o755} {
		if fi, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Error(err)
		} else if fi.Mode() != want {
			t.Errorf("%s: %v, want %v", p, fi.Mode(), want)
		}
	}
}

var pickPlatformCases = []struct {
	name  string
	idx   v1.IndexManifest
	want  int // index of the descriptor picked; -1: ErrNoPlatform
	error string
}{
	{"amd64 among others", v1.IndexManifest{Manifests: []v1.Descriptor{
		{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}},
		{Platform: &v1.Platform{OS: "unknown", Architecture: "unknown"}},
		{Platform: &v1.Platform{OS: "linux", Architecture: "amd64", Variant: "v2"}},
	}}, 2, ""},
	{"one without a platform", v1.IndexManifest{Manifests: []v1.Descriptor{{}}}, 0, ""},
	{"none", v1.IndexManifest{}, -1, "lists no manifests"},
	{"arm only", v1.IndexManifest{Manifests: []v1.Descriptor{{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}}}, -1, "linux/arm64"},
	{"two without a platform", v1.IndexManifest{Manifests: []v1.Descriptor{{}, {}}}, -1, "2 without a platform"},
	{"windows amd64", v1.IndexManifest{Manifests: []v1.Descriptor{{Platform: &v1.Platform{OS: "windows", Architecture: "amd64"}}, {}}}, -1, "windows/amd64, 1 without"},
}

func TestPickPlatform(t *testing.T) {
	for _, tc := range pickPlatformCases {
		for i := range tc.idx.Manifests {
			tc.idx.Manifests[i].Size = int64(i)
		}
		d, err := pickPlatform(&tc.idx)
		if tc.want < 0 {
			if !errors.Is(err, ErrNoPlatform) || !strings.Contains(err.Error(), tc.error) {
				t.Errorf("%s: %v, want ErrNoPlatform with %q", tc.name, err, tc.error)
			}
			continue
		}
		if err != nil || d.Size != int64(tc.want) {
			t.Errorf("%s: %+v, %v; want entry %d", tc.name, d, err, tc.want)
		}
	}
}

func TestManifestKind(t *testing.T) {
	for _, tc := range []struct {
		desc types.MediaType
		raw  string
		want types.MediaType
		err  error
	}{
		{"", `{"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}`, types.OCIImageIndex, nil},
		{types.DockerManifestList, `{"manifests":[]}`, types.DockerManifestList, nil},
		{"", `{"manifests":[]}`, types.OCIImageIndex, nil},
		{"", `{"config":{},"layers":[]}`, types.OCIManifestSchema1, nil},
		{types.DockerManifestSchema2, `{"mediaType":"application/vnd.docker.distribution.manifest.v2+json","config":{}}`, types.DockerManifestSchema2, nil},
		{types.OCIImageIndex, `{"mediaType":"application/vnd.docker.distribution.manifest.v2+json"}`, "", ErrMediaType},
		{types.DockerManifestSchema1, `{}`, "", ErrMediaType},
		{"", `{}`, "", ErrMediaType},
		{"", `{"config":{},"manifests":[]}`, "", ErrMediaType},
		{"", `garbage`, "", nil},
	} {
		got, err := manifestKind(tc.desc, []byte(tc.raw))
		if got != tc.want || (tc.err != nil && !errors.Is(err, tc.err)) || (tc.want == "" && err == nil) {
			t.Errorf("manifestKind(%q, %s) = %q, %v; want %q, %v", tc.desc, tc.raw, got, err, tc.want, tc.err)
		}
	}
}

// FuzzManifestKind: whatever a registry or a layout answers, the kind
// is an index or an image manifest, or an error.
func FuzzManifestKind(f *testing.F) {
	f.Add("", `{"manifests":[]}`)
	f.Add(string(types.DockerManifestSchema2), `{"config":{}}`)
	f.Fuzz(func(t *testing.T, desc, raw string) {
		mt, err := manifestKind(types.MediaType(desc), []byte(raw))
		if err == nil && !mt.IsIndex() && !mt.IsImage() {
			t.Fatalf("%q %q: kind %q", desc, raw, mt)
		}
	})
}

// TestMain keeps the tests' logs quiet.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	os.Exit(m.Run())
}

// TestImportFailureLeavesNothing: an import or a pull of a bad image
// fails, and the images directory is as it was: the earlier image of
// that name intact, no other image, no build directory.
func TestImportFailureLeavesNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("image import needs root")
	}
	for _, tool := range importTools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("image import needs %s", tool)
		}
	}
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Skip("no busybox here")
	}
	good := testImage(t, "amd64", testLayer(t, []tfile{{name: "bin/sh", body: "x"}}), testLayer(t, []tfile{{name: "etc/hostname", body: "x"}}))
	layers, _ := good.Layers()
	second, _ := layers[1].Digest()
	badDigest := writeLayout(t, good)
	if err := os.WriteFile(layoutBlob(t, badDigest, second), layerTarGz(t, []tfile{{name: "etc/hostname", body: "other"}}), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := testRegistry(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/manifests/") {
				_, _ = w.Write([]byte("garbage"))
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	images := filepath.Join(t.TempDir(), "images")
	existing := filepath.Join(images, "mine")
	if err := os.MkdirAll(existing, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(existing, "manifest.json"), []byte("the earlier image"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		run  func(ImportOptions) error
	}{
		{"a layer whose digest does not match", func(o ImportOptions) error {
			o.Source = badDigest
			_, err := Import(t.Context(), o)
			return err
		}},
		{"a name with ..", func(o ImportOptions) error {
			o.Source = tarDir(t, writeLayout(t, testImage(t, "amd64", testLayer(t, []tfile{{name: "../x", body: "x"}}))))
			_, err := Import(t.Context(), o)
			return err
		}},
		{"an image over the entry bound", func(o ImportOptions) error {
			o.Source, o.MaxEntries = dockerSave(t, good), 1
			_, err := Import(t.Context(), o)
			return err
		}},
		{"an index without linux/amd64", func(o ImportOptions) error {
			o.Source = writeLayout(t, nil, testImage(t, "arm64", testLayer(t, nil)))
			_, err := Import(t.Context(), o)
			return err
		}},
		{"a registry answering garbage", func(o ImportOptions) error {
			o.Source = reg + "/r/img:1"
			_, err := Pull(t.Context(), PullOptions{ImportOptions: o, Timeout: 20 * time.Second})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, name := range []string{"mine", "new"} {
				err := tc.run(ImportOptions{OutDir: filepath.Join(images, name), AgentPath: bb})
				if err == nil {
					t.Fatal("no error")
				}
				t.Log(err)
				var left []string
				ents, _ := os.ReadDir(images)
				for _, e := range ents {
					if !strings.HasSuffix(e.Name(), ".lock") {
						left = append(left, e.Name())
					}
				}
				if !reflect.DeepEqual(left, []string{"mine"}) {
					t.Errorf("images after a failed import into %s: %v", name, left)
				}
				if b, _ := os.ReadFile(filepath.Join(existing, "manifest.json")); string(b) != "the earlier image" {
					t.Errorf("the earlier image changed: %q", b)
				}
			}
		})
	}
}

// layerTarGz is a gzipped tar of entries.
func layerTarGz(t *testing.T, entries []tfile) []byte {
	t.Helper()
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	if _, err := z.Write(layerTar(t, entries)); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestImportLayerCompressions: layers plain, gzip'd and zstd'd apply
// alike.
func TestImportLayerCompressions(t *testing.T) {
	plain := layerTar(t, []tfile{{name: "plain", body: "p"}})
	zst, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar(t, []tfile{{name: "zstd", body: "z"}}))), nil
	}, tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	img := testImage(t, "amd64", static.NewLayer(plain, types.OCIUncompressedLayer), testLayer(t, []tfile{{name: "gzip", body: "g"}}), zst)
	src, err := openSource(t.Context(), writeLayout(t, img), testLimits)
	if err != nil {
		t.Fatal(err)
	}
	root, err := unpackInto(t, src, testLimits, false)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"plain": "file:p", "gzip": "file:g", "zstd": "file:z"}
	if got := tree(t, root); !reflect.DeepEqual(got, want) {
		t.Errorf("tree %v, want %v", got, want)
	}
}
