package imagebuild

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/vmgate/vmgate/vm/image"
)

// imageSource is what an import unpacks: a root file system tarball or
// a container image, resolved and checked as far as can be before its
// layers are read.
type imageSource struct {
	// digest identifies the content: image.Inputs.Import.
	digest string
	source image.Source
	// unpack writes the root file system into u's root.
	unpack func(ctx context.Context, u *unpacker) error
}

// openSource finds out what src is: an OCI image layout (a directory
// with an oci-layout file, or a tar of one), a docker save archive
// (a tar with a manifest.json and nothing but image files), or else a
// root file system tarball. Every read of an archive is bounded by lim's
// bytes.
func openSource(ctx context.Context, src string, lim unpackLimits) (*imageSource, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		p, err := layout.FromPath(abs)
		if err != nil {
			return nil, fmt.Errorf("%s: a directory must be an OCI image layout: %w", abs, err)
		}
		lf := layoutFetcher{open: func(name string) (io.ReadCloser, error) {
			if name == "index.json" || name == "oci-layout" {
				return os.Open(filepath.Join(abs, name))
			}
			h, err := v1.NewHash(strings.ReplaceAll(strings.TrimPrefix(name, "blobs/"), "/", ":"))
			if err != nil {
				return nil, err
			}
			return p.Blob(h)
		}}
		return openLayout(ctx, lf, abs)
	}
	open := archiveOpener(ctx, abs, lim)
	kind, err := archiveKind(open)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", abs, err)
	}
	switch kind {
	case image.SourceLayout:
		return openLayout(ctx, layoutFetcher{open: func(name string) (io.ReadCloser, error) { return findInTar(open, name) }}, abs)
	case image.SourceArchive:
		return openDockerArchive(open, abs)
	}
	sum, err := image.FileSHA256(abs)
	if err != nil {
		return nil, err
	}
	return &imageSource{digest: "sha256:" + sum, source: image.Source{Kind: image.SourceRootFS, Reference: abs},
		unpack: func(ctx context.Context, u *unpacker) error { return applyTarball(ctx, u, abs) }}, nil
}

// layoutFetcher reads the files of an OCI image layout by their slash
// paths (a directory's, or a tar's).
type layoutFetcher struct {
	open func(name string) (io.ReadCloser, error)
}

func (l layoutFetcher) get(_ context.Context, desc v1.Descriptor) (io.ReadCloser, error) {
	// A v1.Hash is checked when parsed: an algorithm and hex digits.
	rc, err := l.open("blobs/" + desc.Digest.Algorithm + "/" + desc.Digest.Hex)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", desc.Digest, err)
	}
	return rc, nil
}

// openLayout resolves a layout's index.json to its Platform image.
func openLayout(ctx context.Context, lf layoutFetcher, ref string) (*imageSource, error) {
	rc, err := lf.open("index.json")
	if err != nil {
		return nil, fmt.Errorf("%s: an OCI image layout without index.json: %w", ref, err)
	}
	raw, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes+1))
	rc.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", ref, err)
	}
	if len(raw) > maxManifestBytes {
		return nil, fmt.Errorf("%s: index.json: %w: more than %s", ref, errTooLarge, sizeText(maxManifestBytes))
	}
	img, err := resolve(ctx, lf, v1.Descriptor{MediaType: types.OCIImageIndex}, raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	return img.imageSource(image.SourceLayout, ref), nil
}

func (img *ociImage) imageSource(kind, ref string) *imageSource {
	s := img.source
	s.Kind, s.Reference = kind, ref
	return &imageSource{digest: img.source.ConfigDigest, source: s, unpack: img.apply}
}

// openDockerArchive reads a docker save archive of one image (its
// manifest.json, with no OCI layout beside it: older docker). Its layers
// have no digests of their own; each is checked against its diff ID.
func openDockerArchive(open tarball.Opener, ref string) (*imageSource, error) {
	img, err := tarball.Image(open, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: a docker save archive: %w", ref, err)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", ref, err)
	}
	if len(raw) > maxConfigBytes {
		return nil, fmt.Errorf("%s: configuration: %w: more than %s", ref, errTooLarge, sizeText(maxConfigBytes))
	}
	sum := sha256.Sum256(raw)
	cfgDigest := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	cfg, err := checkConfig(raw, -1)
	if err != nil {
		return nil, fmt.Errorf("%s: configuration: %w", ref, err)
	}
	oi := &ociImage{config: cfg, source: sourceOf(cfg, cfgDigest)}
	for _, d := range cfg.RootFS.DiffIDs {
		l, err := img.LayerByDiffID(d)
		if err != nil {
			return nil, fmt.Errorf("%s: layer %s: %w", ref, d, err)
		}
		oi.layers = append(oi.layers, layerBlob{desc: v1.Descriptor{MediaType: types.DockerUncompressedLayer}, diffID: d,
			open: func(context.Context) (io.ReadCloser, error) { return l.Uncompressed() }})
	}
	return oi.imageSource(image.SourceArchive, ref), nil
}

// archiveOpener opens the tarball at p, decompressed, each time it is
// called; each reading of it is bounded by lim's bytes.
func archiveOpener(ctx context.Context, p string, lim unpackLimits) tarball.Opener {
	return func() (io.ReadCloser, error) {
		f, err := os.Open(p)
		if err != nil {
			return nil, err
		}
		d, err := decompress(ctx, f)
		if err != nil {
			f.Close()
			return nil, err
		}
		return &archiveReader{Reader: &boundedReader{r: d, b: &budget{left: lim.bytes, max: lim.bytes}}, d: d, f: f}, nil
	}
}

type archiveReader struct {
	io.Reader
	d decompressed
	f *os.File
}

func (a *archiveReader) Close() error {
	err := a.d.wait(true)
	a.f.Close()
	return err
}

// archiveMember reports whether name can be a file of an image archive
// (an OCI image layout's or a docker save archive's), and which of the
// files that tell them apart it is ("oci-layout", "manifest.json"; ""
// for another). A root file system has names that are none of these.
func archiveMember(name string) (marker string, ok bool) {
	name = strings.TrimPrefix(path.Clean("/"+name), "/")
	switch {
	case name == "oci-layout", name == "manifest.json":
		return name, true
	case name == "", name == "index.json", name == "repositories", name == "blobs",
		legacyLayer.MatchString(name), blobName.MatchString(name):
		return "", true
	}
	return "", false
}

var (
	// blobName is a layout's blob: blobs/ALGORITHM/HEX (or its directory).
	blobName = regexp.MustCompile(`^blobs/[a-z0-9]+(/[a-f0-9]+)?$`)
	// legacyLayer is an older docker save's (HEX.json, HEX/, HEX/json,
	// HEX/layer.tar, HEX/VERSION) or another writer's (HEX.tar,
	// HEX.tar.gz, sha256:HEX).
	legacyLayer = regexp.MustCompile(`^(sha256:)?[a-f0-9]{64}(\.json|\.tar|\.tar\.gz|/(json|layer\.tar|VERSION))?$`)
)

// archiveKind tells an image archive from a root file system tarball by
// its names (archiveMember): the first name that no image archive has
// makes it a root file system; an archive with an oci-layout file is a
// layout (a newer docker save has both), one with only a manifest.json a
// docker save archive.
func archiveKind(open tarball.Opener) (string, error) {
	rc, err := open()
	if err != nil {
		return "", err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("not a readable tar archive: %w", err)
		}
		marker, ok := archiveMember(h.Name)
		if !ok {
			return image.SourceRootFS, nil
		}
		seen[marker] = true
	}
	switch {
	case seen["oci-layout"]:
		return image.SourceLayout, nil
	case seen["manifest.json"]:
		return image.SourceArchive, nil
	}
	return image.SourceRootFS, nil
}

// findInTar opens the regular file name of the tar that open reads.
func findInTar(open tarball.Opener, name string) (io.ReadCloser, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err != nil {
			rc.Close()
			if err == io.EOF {
				return nil, fmt.Errorf("%s: %w", name, os.ErrNotExist)
			}
			return nil, err
		}
		if path.Clean(h.Name) != name {
			continue
		}
		if h.Typeflag != tar.TypeReg {
			rc.Close()
			return nil, fmt.Errorf("%s: %w: not a regular file", name, errors.ErrUnsupported)
		}
		return struct {
			io.Reader
			io.Closer
		}{tr, rc}, nil
	}
}
