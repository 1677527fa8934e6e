package imagebuild

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/vmgate/vmgate/vm/image"
)

// Bounds of a pull, besides the import's on bytes and entries.
const (
	// DefaultPullTimeout bounds a whole pull: download, unpack and
	// the image's making.
	DefaultPullTimeout = time.Hour
	// DefaultPullStall bounds a registry's silence: the wait for a
	// response's head, and between two reads of its body.
	DefaultPullStall = time.Minute
	// pullSlack is what a pull may download beyond the import's byte
	// bound: manifests, configurations, token answers.
	pullSlack = 64 << 20
)

// PullOptions configure Pull.
type PullOptions struct {
	// ImportOptions' Source is the reference: NAME[:TAG] or
	// NAME@sha256:HEX, with a registry host or without (Docker Hub's
	// short names, "python:3.12-slim"). MaxBytes bounds the bytes
	// downloaded too.
	ImportOptions
	// Timeout bounds the whole pull (default DefaultPullTimeout), Stall
	// the registry's silence (default DefaultPullStall).
	Timeout, Stall time.Duration
	// Keychain finds credentials for the registry (default
	// authn.DefaultKeychain: the Docker config file,
	// $DOCKER_CONFIG/config.json, and the credential helpers it names).
	Keychain authn.Keychain
	// Transport carries the requests (default remote.DefaultTransport,
	// with a proxy from the environment: HTTPS_PROXY, NO_PROXY); the
	// pull's bounds wrap it.
	Transport http.RoundTripper
}

// Pull makes an image, as Import does, from a registry's image: the
// reference's manifest, or its index's linux/amd64 manifest, and its
// layers, each checked against its digest as it streams into the
// unpacker (nothing is stored but the image made). The registry
// protocol, its authentication and its retries are
// go-containerregistry's.
//
// Postcondition: as for Build.
func Pull(ctx context.Context, opts PullOptions) (*Result, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("image pull: unpacking a root file system with its owners needs root")
	}
	timeout := cmpDuration(opts.Timeout, DefaultPullTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	src, err := openRemote(ctx, opts)
	if err != nil {
		return nil, err
	}
	res, err := importFrom(ctx, opts.ImportOptions, src)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("%w (the pull's time limit is %s)", err, timeout)
	}
	return res, err
}

// openRemote resolves opts.Source in its registry to its Platform
// image, whose layers are fetched as they are unpacked.
func openRemote(ctx context.Context, opts PullOptions) (*imageSource, error) {
	ref, err := name.ParseReference(opts.Source)
	if err != nil {
		return nil, fmt.Errorf("image pull: %w", err)
	}
	if err := checkScheme(ref.Context().Registry); err != nil {
		return nil, fmt.Errorf("image pull: %w", err)
	}
	keys := opts.Keychain
	if keys == nil {
		keys = authn.DefaultKeychain
	}
	base := opts.Transport
	if base == nil {
		base = remote.DefaultTransport
	}
	stall := cmpDuration(opts.Stall, DefaultPullStall)
	if t, ok := base.(*http.Transport); ok {
		t = t.Clone()
		t.ResponseHeaderTimeout = stall
		base = t
	}
	lim := opts.limits()
	rt := &boundedTransport{rt: base, stall: stall, max: lim.bytes + pullSlack}
	rt.left.Store(rt.max)
	ropts := []remote.Option{remote.WithAuthFromKeychain(keys), remote.WithTransport(rt), remote.WithContext(ctx),
		remote.WithPlatform(Platform), remote.WithUserAgent("vmgated")}
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	log.Info("image pull", "ref", ref.Name(), "registry", ref.Context().RegistryStr())
	d, err := remote.Get(ref, ropts...)
	if err != nil {
		return nil, fmt.Errorf("image pull: %s: %w", ref.Name(), err)
	}
	img, err := resolve(ctx, registryFetcher{repo: ref.Context(), opts: ropts}, d.Descriptor, d.Manifest)
	if err != nil {
		return nil, fmt.Errorf("image pull: %s: %w", ref.Name(), err)
	}
	return img.imageSource(image.SourceRegistry, ref.Name()), nil
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// checkScheme refuses a registry that the library would speak plain
// HTTP to (it does to private addresses and *.localhost names), except
// to a loopback address: a tag's answer is checked against nothing, so
// it must come over TLS.
func checkScheme(reg name.Registry) error {
	if reg.Scheme() == "https" {
		return nil
	}
	host, _, err := net.SplitHostPort(reg.RegistryStr())
	if err != nil {
		host = reg.RegistryStr()
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("registry %s would be spoken to over plain HTTP (the registry library does so to private addresses); vmgate pulls over HTTPS only, loopback excepted: name the registry by a host name it serves HTTPS for", reg.RegistryStr())
}

// registryFetcher gets a repository's blobs and manifests by digest.
type registryFetcher struct {
	repo name.Repository
	opts []remote.Option
}

func (r registryFetcher) get(ctx context.Context, desc v1.Descriptor) (io.ReadCloser, error) {
	ref := r.repo.Digest(desc.Digest.String())
	opts := append(slices.Clone(r.opts), remote.WithContext(ctx))
	if desc.MediaType.IsIndex() || desc.MediaType.IsImage() {
		d, err := remote.Get(ref, opts...)
		if err != nil {
			return nil, err
		}
		return io.NopCloser(bytes.NewReader(d.Manifest)), nil
	}
	l, err := remote.Layer(ref, opts...)
	if err != nil {
		return nil, err
	}
	return l.Compressed()
}

// errStalled reports a registry silent for longer than a pull's Stall.
var errStalled = errors.New("the registry stopped sending")

// boundedTransport bounds what a registry's answers may cost: max bytes
// of bodies in all (a registry answering with endless garbage), and
// stall between two reads of a body (one answering slowly; the wait for
// a response's head is the http.Transport's ResponseHeaderTimeout).
type boundedTransport struct {
	rt    http.RoundTripper
	stall time.Duration
	max   int64
	left  atomic.Int64
}

func (b *boundedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.rt.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.ContentLength > b.left.Load() {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %w: the registry answers with %d bytes, more than a pull may download", req.URL.Redacted(), errTooLarge, resp.ContentLength)
	}
	body := &boundedBody{rc: resp.Body, t: b}
	body.timer = time.AfterFunc(b.stall, func() {
		body.stalled.Store(true)
		resp.Body.Close()
	})
	body.timer.Stop() // runs from each Read
	resp.Body = body
	return resp, nil
}

type boundedBody struct {
	rc      io.ReadCloser
	t       *boundedTransport
	timer   *time.Timer
	stalled atomic.Bool
}

func (b *boundedBody) Read(p []byte) (int, error) {
	b.timer.Reset(b.t.stall)
	n, err := b.rc.Read(p)
	b.timer.Stop()
	if b.stalled.Load() {
		return n, fmt.Errorf("%w for %s", errStalled, b.t.stall)
	}
	if b.t.left.Add(-int64(n)) < 0 {
		return n, fmt.Errorf("%w: the registry sent more than %s", errTooLarge, sizeText(b.t.max))
	}
	return n, err
}

func (b *boundedBody) Close() error {
	b.timer.Stop()
	return b.rc.Close()
}
