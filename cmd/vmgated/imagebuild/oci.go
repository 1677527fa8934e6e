package imagebuild

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/zstd"

	"github.com/vmgate/vmgate/vm/image"
)

// Bounds of an image's metadata, each read whole into memory: a manifest
// or an index, and an image's configuration (its history makes it the
// larger). Real ones are a few KiB.
const (
	maxManifestBytes = 4 << 20
	maxConfigBytes   = 8 << 20
	// maxIndexDepth bounds how many indexes may lead to the image
	// manifest (a registry's index of platforms, in a layout's
	// index.json, is two).
	maxIndexDepth = 4
	// maxZstdWindow bounds a zstd layer decoder's memory.
	maxZstdWindow = 128 << 20
)

// Platform is the only platform an image may be: the guest's.
var Platform = v1.Platform{OS: "linux", Architecture: "amd64"}

// Errors of images that are not what they say they are.
var (
	// ErrNoPlatform reports an image (or an index) without Platform.
	ErrNoPlatform = errors.New("the image has no linux/amd64 variant")
	// ErrMediaType reports a manifest, configuration or layer of a media
	// type that an import does not know.
	ErrMediaType = errors.New("unknown media type")
	// ErrDigest reports a blob whose bytes do not match its descriptor's
	// digest or size.
	ErrDigest = errors.New("the content does not match its digest")
)

// layerCompressions are the layer media types an import applies, and
// their compression. Foreign and non-distributable layers (Windows
// images) are not among them.
var layerCompressions = map[types.MediaType]string{
	types.OCIUncompressedLayer:    "",
	types.OCILayer:                "gzip",
	types.OCILayerZStd:            "zstd",
	types.DockerUncompressedLayer: "",
	types.DockerLayer:             "gzip",
}

// fetcher gets the blobs (manifests, configurations, layers) of one
// image's source by their descriptors: from a layout, an archive or a
// registry. What it returns is checked by its callers (verified).
type fetcher interface {
	get(ctx context.Context, desc v1.Descriptor) (io.ReadCloser, error)
}

// ociImage is an image resolved to Platform: what an import applies.
type ociImage struct {
	source image.Source
	config *v1.ConfigFile
	layers []layerBlob
}

// layerBlob is one layer to apply, in order.
type layerBlob struct {
	// desc is the blob's digest, size and media type; a zero digest
	// is a layer of a docker save archive, which has none (its diff ID
	// is still checked).
	desc   v1.Descriptor
	diffID v1.Hash
	open   func(ctx context.Context) (io.ReadCloser, error)
}

// readBlob reads the whole blob desc names, at most max bytes, checking
// its digest and size.
func readBlob(ctx context.Context, f fetcher, desc v1.Descriptor, max int64) ([]byte, error) {
	if desc.Size > max {
		return nil, fmt.Errorf("%s: %w: %d bytes, more than the %s allowed", desc.Digest, errTooLarge, desc.Size, sizeText(max))
	}
	rc, err := f.get(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(verified(rc, desc))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// verified reads r, which must be desc's blob: one byte past desc.Size,
// or a digest other than desc.Digest at the end, is ErrDigest. A
// descriptor without a digest (a docker save layer) checks nothing.
func verified(r io.Reader, desc v1.Descriptor) io.Reader {
	if desc.Digest == (v1.Hash{}) {
		return r
	}
	return &digestReader{r: r, want: desc.Digest, size: desc.Size, h: sha256.New()}
}

type digestReader struct {
	r    io.Reader
	want v1.Hash
	size int64 // -1: not known
	n    int64
	h    hash.Hash
}

func (d *digestReader) Read(p []byte) (int, error) {
	if d.want.Algorithm != "sha256" {
		return 0, fmt.Errorf("%w: %s is not a sha256 digest", ErrDigest, d.want)
	}
	if d.size >= 0 && int64(len(p)) > d.size-d.n+1 {
		p = p[:d.size-d.n+1]
	}
	n, err := d.r.Read(p)
	d.n += int64(n)
	d.h.Write(p[:n])
	if d.size >= 0 && d.n > d.size {
		return n, fmt.Errorf("%w: %s has more than its %d bytes", ErrDigest, d.want, d.size)
	}
	if err == io.EOF {
		if d.size >= 0 && d.n != d.size {
			return n, fmt.Errorf("%w: %s has %d bytes, not %d (truncated?)", ErrDigest, d.want, d.n, d.size)
		}
		if got := hex.EncodeToString(d.h.Sum(nil)); got != d.want.Hex {
			return n, fmt.Errorf("%w: %s hashes to sha256:%s", ErrDigest, d.want, got)
		}
	}
	return n, err
}

// manifestHead is what tells the kinds of manifest apart.
type manifestHead struct {
	MediaType types.MediaType `json:"mediaType"`
	Manifests json.RawMessage `json:"manifests"`
	Config    json.RawMessage `json:"config"`
}

// manifestKind is the media type of a manifest: its descriptor's, or
// the one it declares, or (neither saying) what its fields show. Only an
// index or an image manifest is known; a descriptor and a manifest that
// disagree are refused.
func manifestKind(descType types.MediaType, raw []byte) (types.MediaType, error) {
	var h manifestHead
	if err := json.Unmarshal(raw, &h); err != nil {
		return "", fmt.Errorf("not a manifest: %w", err)
	}
	mt := descType
	switch {
	case mt == "":
		mt = h.MediaType
	case h.MediaType != "" && h.MediaType != mt:
		return "", fmt.Errorf("%w: the descriptor says %s, the manifest %s", ErrMediaType, mt, h.MediaType)
	}
	if mt == "" {
		switch {
		case h.Manifests != nil && h.Config == nil:
			mt = types.OCIImageIndex
		case h.Config != nil && h.Manifests == nil:
			mt = types.OCIManifestSchema1
		}
	}
	if mt.IsIndex() || (mt.IsImage() && !mt.IsSchema1()) {
		return mt, nil
	}
	return "", fmt.Errorf("%w: %q is not an image manifest or index", ErrMediaType, mt)
}

// pickPlatform chooses the index's manifest for Platform (any variant).
// An index whose one entry says no platform (a layout's index.json
// often) gives that entry: its configuration is checked later. Nothing
// for Platform is ErrNoPlatform, naming what there is.
func pickPlatform(idx *v1.IndexManifest) (v1.Descriptor, error) {
	var unnamed []v1.Descriptor
	var seen []string
	for _, d := range idx.Manifests {
		if d.Platform == nil {
			unnamed = append(unnamed, d)
			continue
		}
		if d.Platform.OS == Platform.OS && d.Platform.Architecture == Platform.Architecture {
			return d, nil
		}
		seen = append(seen, d.Platform.OS+"/"+d.Platform.Architecture)
	}
	if len(unnamed) == 1 && len(seen) == 0 {
		return unnamed[0], nil
	}
	if len(seen) == 0 && len(unnamed) == 0 {
		return v1.Descriptor{}, fmt.Errorf("%w: the index lists no manifests", ErrNoPlatform)
	}
	if len(unnamed) > 0 {
		seen = append(seen, fmt.Sprintf("%d without a platform", len(unnamed)))
	}
	return v1.Descriptor{}, fmt.Errorf("%w (it has %s)", ErrNoPlatform, strings.Join(seen, ", "))
}

// resolve walks from a manifest or index (raw, named by top, already
// checked against top's digest when it has one) through indexes to the
// image manifest for Platform, and reads its configuration. A chain of
// indexes deeper than maxIndexDepth, or one that names a manifest seen
// before (content addressing makes that a lie), is refused.
func resolve(ctx context.Context, f fetcher, top v1.Descriptor, raw []byte) (*ociImage, error) {
	desc := top
	seen := map[v1.Hash]bool{}
	for depth := 0; ; depth++ {
		mt, err := manifestKind(desc.MediaType, raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", nameOf(desc), err)
		}
		if mt.IsImage() {
			desc.MediaType = mt
			return readImage(ctx, f, desc, raw)
		}
		if depth == maxIndexDepth {
			return nil, fmt.Errorf("%s: more than %d indexes lead to the image", nameOf(desc), maxIndexDepth)
		}
		idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", nameOf(desc), err)
		}
		child, err := pickPlatform(idx)
		if err != nil {
			return nil, err
		}
		if seen[child.Digest] || child.Digest == top.Digest {
			return nil, fmt.Errorf("%s: a manifest list loop: %s lists a manifest that leads to itself", nameOf(desc), child.Digest)
		}
		seen[child.Digest] = true
		if !child.MediaType.IsIndex() && !child.MediaType.IsImage() {
			return nil, fmt.Errorf("%s: %w: %q is not an image manifest or index", child.Digest, ErrMediaType, child.MediaType)
		}
		if raw, err = readBlob(ctx, f, child, maxManifestBytes); err != nil {
			return nil, err
		}
		desc = child
	}
}

func nameOf(d v1.Descriptor) string {
	if d.Digest == (v1.Hash{}) {
		return "the top index"
	}
	return d.Digest.String()
}

// readImage reads an image manifest's configuration and lists its layers.
func readImage(ctx context.Context, f fetcher, desc v1.Descriptor, raw []byte) (*ociImage, error) {
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", desc.Digest, err)
	}
	if mt := m.Config.MediaType; mt != types.OCIConfigJSON && mt != types.DockerConfigJSON {
		return nil, fmt.Errorf("%s: %w: a configuration of %q (not a container image?)", desc.Digest, ErrMediaType, mt)
	}
	for _, l := range m.Layers {
		if _, ok := layerCompressions[l.MediaType]; !ok {
			return nil, fmt.Errorf("layer %s: %w: %q", l.Digest, ErrMediaType, l.MediaType)
		}
	}
	rawCfg, err := readBlob(ctx, f, m.Config, maxConfigBytes)
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	cfg, err := checkConfig(rawCfg, len(m.Layers))
	if err != nil {
		return nil, fmt.Errorf("configuration %s: %w", m.Config.Digest, err)
	}
	img := &ociImage{config: cfg, source: sourceOf(cfg, m.Config.Digest)}
	img.source.ManifestDigest = desc.Digest.String()
	for i, l := range m.Layers {
		img.layers = append(img.layers, layerBlob{desc: l, diffID: cfg.RootFS.DiffIDs[i],
			open: func(ctx context.Context) (io.ReadCloser, error) { return f.get(ctx, l) }})
	}
	return img, nil
}

// checkConfig parses an image configuration and checks it describes a
// Platform image of n layers (n < 0: any number).
func checkConfig(raw []byte, n int) (*v1.ConfigFile, error) {
	cfg, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	if cfg.OS != Platform.OS || cfg.Architecture != Platform.Architecture {
		return nil, fmt.Errorf("%w: it is %s/%s", ErrNoPlatform, cfg.OS, cfg.Architecture)
	}
	if n >= 0 && len(cfg.RootFS.DiffIDs) != n {
		return nil, fmt.Errorf("it lists %d layers, the manifest %d", len(cfg.RootFS.DiffIDs), n)
	}
	return cfg, nil
}

// sourceOf is what the image's own manifest records of its
// configuration.
func sourceOf(cfg *v1.ConfigFile, configDigest v1.Hash) image.Source {
	return image.Source{
		ConfigDigest: configDigest.String(),
		Platform:     cfg.OS + "/" + cfg.Architecture,
		Env:          cfg.Config.Env,
		WorkingDir:   cfg.Config.WorkingDir,
		User:         cfg.Config.User,
	}
}

// apply unpacks the image's layers in order into u's root, checking
// each against its digest, size and diff ID. A layer that fails its
// check fails the import after (not before) its entries were written
// into the scratch root, which the import then removes.
func (img *ociImage) apply(ctx context.Context, u *unpacker) error {
	for i, l := range img.layers {
		if err := applyLayer(ctx, u, l); err != nil {
			return fmt.Errorf("layer %d of %d (%s): %w", i+1, len(img.layers), l.diffID, err)
		}
	}
	return nil
}

func applyLayer(ctx context.Context, u *unpacker, l layerBlob) error {
	comp, ok := layerCompressions[l.desc.MediaType]
	if !ok {
		return fmt.Errorf("%w: %q", ErrMediaType, l.desc.MediaType)
	}
	rc, err := l.open(ctx)
	if err != nil {
		return err
	}
	defer rc.Close()
	blob := verified(rc, l.desc)
	var stream io.Reader
	switch comp {
	case "gzip":
		z, err := gzip.NewReader(blob)
		if err != nil {
			return fmt.Errorf("gzip: %w", err)
		}
		defer z.Close()
		stream = z
	case "zstd":
		z, err := zstd.NewReader(blob, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return fmt.Errorf("zstd: %w", err)
		}
		defer z.Close()
		stream = z
	default:
		stream = blob
	}
	if err := u.apply(ctx, verified(stream, v1.Descriptor{Digest: l.diffID, Size: -1}), true); err != nil {
		return err
	}
	// The blob to its end, for its digest.
	_, err = io.Copy(io.Discard, blob)
	return err
}
