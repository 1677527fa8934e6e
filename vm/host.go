package vm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmgate/vmgate/internal/names"

	"github.com/vmgate/vmgate/isolate/cgroup"
	"github.com/vmgate/vmgate/vm/image"
	"github.com/vmgate/vmgate/vm/netstack"
)

// Host is where VMs come from: built once per daemon, it owns the checked
// image, the jails' cgroup, and one template and one pool per VM shape.
// Get returns a fresh VM of a shape, with or without a NIC: ready in the
// shape's pool, restored from its template, or (until the template is
// ready, when it cannot be built, or with templates off) booted cold.
// Templates load, or build in the background, the first time a shape is
// asked for (Warm asks ahead).
//
// A VM of a shape with a NIC comes with a network that allows nothing
// (HostConfig.Network); the caller gives it the request's policy with
// Network().SetPolicy.
type Host struct {
	cfg     HostConfig
	cgroups *cgroup.Manager
	log     *slog.Logger

	// imagesMu guards images, the directory of each image name in use
	// (UseImages; the default image's starts as cfg.ImageDir), and
	// digest, the default image's base digest.
	imagesMu sync.Mutex
	images   map[string]string
	digest   string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// building admits one template build (a boot) at a time: on a small
	// host parallel builds only slow each other and the cold boots that
	// serve requests meanwhile.
	building chan struct{}

	mu     sync.Mutex
	shapes map[Shape]*shapeEntry
	// pastFailures counts the handshake failures of discarded templates.
	pastFailures int64

	// digestMu guards digests, ImageDigestOf's and ImageSourceOf's
	// cache: the base digest and source of each image, with the identity
	// of the manifest they came from.
	digestMu sync.Mutex
	digests  map[string]cachedDigest
	// readManifest reads an image's manifest; nil means
	// image.ReadManifest. Tests count the reads.
	readManifest func(dir string) (*image.Manifest, error)
}

// cachedDigest is an image's base digest and source as read from its
// manifest.
type cachedDigest struct {
	manifest fileIdentity
	digest   string
	source   *image.Source // nil: none (a built image)
}

// fileIdentity tells a file's versions apart without reading it: a
// manifest is replaced by a rename (a new inode) or, by hand, rewritten
// in place (a new size or time stamps).
type fileIdentity struct {
	dev, ino     uint64
	size         int64
	mtime, ctime syscall.Timespec
}

// identityOf is the identity of the file at path.
func identityOf(path string) (fileIdentity, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileIdentity{}, err
	}
	return fileIdentity{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}, nil
}

// HostConfig is what a Host is built from: the runtime of its VMs, its
// images, and how it keeps VMs ready.
//
// Precondition: its directories are absolute and reach their directory
// through no symlink (HostConfig.ResolveDirs makes them so), as the
// Runtime's are: QEMU is given paths under them, and its jail binds each
// file at its real path.
type HostConfig struct {
	Runtime
	// ImageDir is the image named DefaultImage; ImagesDir holds the
	// others, one directory per name (default StateDir/images). A name's
	// directory under ImagesDir may be a symlink: the Host uses the
	// directory UseImages gave it.
	ImageDir, ImagesDir string
	// Cgroups is the cgroup mode (cgroup.OpenMode): "auto", "required"
	// or "off".
	Cgroups string
	// Network is the plumbing of every NIC's network (resolver, log),
	// with no policy.
	Network netstack.Config
	// PoolSize is how many restored VMs each shape keeps ready.
	PoolSize int
	// Ahead is how many clones each shape keeps launched ahead (QEMU up,
	// waiting for its state; see Pool).
	Ahead int
	// NoTemplate boots every VM cold.
	NoTemplate bool
}

// Shape is what VMs of one template share.
type Shape struct {
	// Image is the guest image's name: DefaultImage (or "") is
	// HostConfig.ImageDir, any other NAME is ImagesDir/NAME.
	Image           string
	MemoryMiB, CPUs int
	// DiskMiB is the VMs' disk limit (Options.DiskMiB): a template makes
	// its guest's reserve before it is saved, so each limit is a shape.
	DiskMiB int
	Seccomp string // the jail's filter mode
	Network bool   // the VMs have a NIC
}

// Normal is the shape with its image named and its disk limit set: ""
// and DefaultImage are one image, a disk limit of 0 is DefaultDiskMiB,
// and each must be one template and one pool.
func (k Shape) Normal() Shape { return k.normal() }

func (k Shape) normal() Shape {
	if k.Image == "" {
		k.Image = DefaultImage
	}
	if k.DiskMiB == 0 {
		k.DiskMiB = DefaultDiskMiB
	}
	return k
}

// How a VM came from Get.
const (
	FromPool    = "pool"    // ready in the shape's pool
	FromRestore = "restore" // restored from the template now
	FromBoot    = "boot"    // booted cold
)

type shapeEntry struct {
	// loaded is closed once the attempt to load an existing template
	// ended (ready, or building now, or failed): a request waits for a
	// load (a second or so), never for a build.
	loaded   chan struct{}
	ready    bool
	failedAt time.Time     // the build failed; retried after retry
	retry    time.Duration // how long after failedAt
	failures int           // builds of the shape that failed in a row
	tmpl     *Template
	pool     *Pool
}

// A shape whose template build failed boots cold until the build is tried
// again: firstRetry after the first failure, twice as long after each
// further one, at most maxRetry. A full disk or a transient fault heals
// without a restart, soon; a template that cannot be built costs one
// attempt per maxRetry.
const (
	firstRetry = 30 * time.Second
	maxRetry   = 10 * time.Minute
)

// retryAfter is the wait after the failures-th failed build in a row.
func retryAfter(failures int) time.Duration {
	d := firstRetry
	for i := 1; i < failures && d < maxRetry; i++ {
		d *= 2
	}
	return min(d, maxRetry)
}

// NewHost removes what a crashed daemon left in the state directory,
// opens the jails' cgroup and checks the image. It starts no VM.
//
// Postcondition: on error nothing is left open.
func NewHost(cfg HostConfig) (*Host, error) {
	cfg.setDefaults()
	log := cfg.Log
	if n, err := CleanupStale(cfg.StateDir, log); err != nil {
		return nil, fmt.Errorf("clean up leftovers: %w", err)
	} else if n > 0 {
		log.Warn("removed VMs left by a previous run", "count", n)
	}
	m, err := checkImageDir(cfg.ImageDir, true)
	if err != nil {
		return nil, err
	}
	cg, err := cgroup.OpenMode(cfg.Cgroups, cgroup.GroupName(cfg.StateDir), log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &Host{cfg: cfg, cgroups: cg, log: log, ctx: ctx, cancel: cancel,
		images: map[string]string{DefaultImage: cfg.ImageDir}, digest: m.Artifacts[image.BaseFile].SHA256,
		building: make(chan struct{}, 1), shapes: map[Shape]*shapeEntry{}}
	if cfg.NoTemplate {
		log.Info("VM templates off: every VM boots cold")
	}
	return h, nil
}

// ImageDigest is the SHA-256 of the default image's base.
func (h *Host) ImageDigest() string {
	h.imagesMu.Lock()
	defer h.imagesMu.Unlock()
	return h.digest
}

// ImageDigestOf is the SHA-256 of image name's base, or "" when it cannot
// be read. The gateway asks for it on every exec's audit record, so the
// manifest is read once per version of it: each call costs a stat, and
// a manifest replaced or rewritten since the last call is read again.
func (h *Host) ImageDigestOf(name string) string {
	if name == "" || name == DefaultImage {
		return h.ImageDigest()
	}
	return h.manifestOf(name).digest
}

// ImageSourceOf is where image name came from and the configuration it
// brings (its manifest's source: read, and cached, as ImageDigestOf
// reads the digest), or nil: a built image, or one whose manifest
// cannot be read. The caller must not change it.
func (h *Host) ImageSourceOf(name string) *ImageSource {
	if name == "" {
		name = DefaultImage
	}
	return h.manifestOf(name).source
}

// manifestOf is what ImageDigestOf and ImageSourceOf read of image name's
// manifest: read once per version of it (a stat per call), zero when it
// cannot be read.
func (h *Host) manifestOf(name string) cachedDigest {
	dir, err := h.ImageDir(name)
	if err != nil {
		return cachedDigest{}
	}
	id, err := identityOf(filepath.Join(dir, image.ManifestFile))
	if err != nil {
		h.forgetDigest(name)
		return cachedDigest{}
	}
	h.digestMu.Lock()
	c, ok := h.digests[name]
	h.digestMu.Unlock()
	if ok && c.manifest == id {
		return c
	}
	// A manifest replaced between the stat and the read is stored under
	// its old identity, and read again on the next call.
	read := h.readManifest
	if read == nil {
		read = image.ReadManifest
	}
	m, err := read(dir)
	if err != nil {
		h.forgetDigest(name)
		return cachedDigest{}
	}
	c = cachedDigest{manifest: id, digest: m.Artifacts[image.BaseFile].SHA256, source: m.Source}
	h.digestMu.Lock()
	if h.digests == nil {
		h.digests = map[string]cachedDigest{}
	}
	h.digests[name] = c
	h.digestMu.Unlock()
	return c
}

// forgetDigest drops ImageDigestOf's cached digest of image name.
func (h *Host) forgetDigest(name string) {
	h.digestMu.Lock()
	delete(h.digests, name)
	h.digestMu.Unlock()
}

// Get returns a fresh VM of the shape and how it was made (FromPool,
// FromRestore, FromBoot). A restore that fails discards the shape's
// template (rebuilt on the next request) and the VM boots cold, unless
// the host ran short of something (hostShortOf): then the template is
// kept and the error returned. If ctx ends first, nothing is left
// running.
func (h *Host) Get(ctx context.Context, k Shape) (*VM, string, error) {
	k = k.normal()
	if _, err := h.ImageDir(k.Image); err != nil {
		return nil, "", err // never the default image in its place
	}
	if !h.cfg.NoTemplate {
		m, how, err := h.restore(ctx, k)
		switch {
		case m != nil:
			return m, how, nil
		case hostShortOf(err):
			// A cold boot needs more of what ran short (disk for its
			// overlay, memory for all of its RAM) and takes a boot's time
			// to fail the same way.
			return nil, "", err
		case err != nil && ctx.Err() == nil:
			h.log.Warn("restore from template failed, booting cold", "err", err)
		}
	}
	m, err := Start(ctx, h.options(k))
	if err != nil {
		return nil, "", err
	}
	return m, FromBoot, nil
}

// Resume starts a VM of shape k from a save point (a paused session's, a
// fork's): k's image, the host's runtime, cgroups and network plumbing (a
// VM with a NIC gets a network that allows nothing: SetPolicy). The save
// point must have been saved from this machine (SavePoint.Matches).
// shared: see SavePoint.Restore.
func (h *Host) Resume(ctx context.Context, sp *SavePoint, k Shape, shared bool) (*VM, error) {
	k = k.normal()
	if _, err := h.ImageDir(k.Image); err != nil {
		return nil, err
	}
	return sp.Restore(ctx, h.options(k), shared)
}

// DefaultImage is the name of the daemon's own image (--image).
const DefaultImage = "default"

// ImageDir is the directory of the image name: the one UseImages gave
// it, else HostConfig.ImageDirOf. A name is 1 to 64 of [A-Za-z0-9._-],
// starting with a letter or digit (as the policy checks): no path can be
// built from it.
func (h *Host) ImageDir(name string) (string, error) {
	if name == "" {
		name = DefaultImage
	}
	h.imagesMu.Lock()
	dir, ok := h.images[name]
	h.imagesMu.Unlock()
	if ok {
		return dir, nil
	}
	return h.cfg.ImageDirOf(name)
}

// ImageDirOf is the directory of the image name under c (pure): ImageDir
// for DefaultImage (or ""), ImagesDir/NAME for any other name.
func (c HostConfig) ImageDirOf(name string) (string, error) {
	if name == "" || name == DefaultImage {
		return c.ImageDir, nil
	}
	if !names.Image(name) {
		return "", fmt.Errorf("image %q: not an image name", name)
	}
	return filepath.Join(c.imagesDir(), name), nil
}

func (c HostConfig) imagesDir() string {
	if c.ImagesDir != "" {
		return c.ImagesDir
	}
	return filepath.Join(c.StateDir, imagesSubdir)
}

// CheckImage reports whether image name is built and whole (its files
// against its manifest, sizes only: a full check reads every byte).
func (h *Host) CheckImage(name string) error {
	dir, err := h.ImageDir(name)
	if err != nil {
		return err
	}
	h.forgetDigest(name) // a check (a reload) reads the image afresh
	if err := CheckImageDir(dir); err != nil {
		return fmt.Errorf("image %q: %w", name, err)
	}
	return nil
}

// CheckImageDir reports whether the image in dir is built and whole (its
// files against its manifest, sizes only: a full check reads every byte).
func CheckImageDir(dir string) error {
	_, err := checkImageDir(dir, false)
	return err
}

// ImageSource is where an imported or pulled image came from, and the
// configuration its commands default to (nil for a built image).
type ImageSource = image.Source

// ImageManifestDigest is the manifest digest the image in dir records
// ("sha256:HEX"), or "" for one without a source: built, or imported from
// a root file system.
func ImageManifestDigest(dir string) (string, error) {
	m, err := image.ReadManifest(dir)
	if err != nil {
		return "", err
	}
	if m.Source == nil {
		return "", nil
	}
	return m.Source.ManifestDigest, nil
}

// checkImageDir reads and checks the image in dir: built, runnable, and
// its files as its manifest says (every byte with full, else sizes).
func checkImageDir(dir string, full bool) (*image.Manifest, error) {
	m, err := image.ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if err := m.CheckRunnable(dir); err != nil {
		return nil, err
	}
	if err := m.Verify(dir, full); err != nil {
		return nil, err
	}
	return m, nil
}

// ImageMove is an image name whose directory UseImages changed.
type ImageMove struct{ Name, From, To string }

// UseImages gives image names their directories: dirs maps a name
// (DefaultImage for HostConfig.ImageDir's) to the directory it names now,
// absolute and through no symlink (ResolveImageDir), as the caller
// resolved it (the daemon: at start and at each reload, so that a flipped
// link such as image -> image-2026-12 takes effect there). A name whose
// directory changed is checked there first, as NewHost checks the default
// image (every byte) and CheckImage another (sizes); if one fails nothing
// changes. Then the templates and pools of its shapes are dropped and
// warmed again: its next VMs come from the new directory (their template
// loads or builds anew), and VMs running now keep the files they started
// with (QEMU holds them open, its jail has them bound). It returns what
// moved, by name.
func (h *Host) UseImages(dirs map[string]string) ([]ImageMove, error) {
	var moves []ImageMove
	digest := ""
	for name, dir := range dirs {
		if name == "" {
			name = DefaultImage
		}
		cur, err := h.ImageDir(name)
		if err != nil {
			return nil, err
		}
		if cur == dir {
			continue
		}
		m, err := checkImageDir(dir, name == DefaultImage)
		if err != nil {
			return nil, fmt.Errorf("image %q in %s: %w", name, dir, err)
		}
		if name == DefaultImage {
			digest = m.Artifacts[image.BaseFile].SHA256
		}
		moves = append(moves, ImageMove{Name: name, From: cur, To: dir})
	}
	slices.SortFunc(moves, func(a, b ImageMove) int { return strings.Compare(a.Name, b.Name) })
	h.imagesMu.Lock()
	if h.images == nil {
		h.images = map[string]string{}
	}
	for _, mv := range moves {
		h.images[mv.Name] = mv.To
		if mv.Name == DefaultImage {
			h.digest = digest
		}
	}
	h.imagesMu.Unlock()
	for _, mv := range moves {
		h.forgetDigest(mv.Name)
		h.retire(mv.Name)
	}
	return moves, nil
}

// retire drops the shapes of image name, whose directory changed: their
// pools are closed (the VMs waiting in them destroyed) and their
// templates released, but kept on disk (a template's key names its
// image's digests; building the shape's new one removes a stale one). A
// shape still loading or building its template is dropped once that is
// done (ready). Each shape is warmed again, from the new directory.
func (h *Host) retire(name string) {
	h.mu.Lock()
	var gone []*shapeEntry
	var shapes []Shape
	for k, e := range h.shapes {
		if k.Image != name {
			continue
		}
		delete(h.shapes, k)
		shapes = append(shapes, k)
		if e.ready {
			h.pastFailures += e.tmpl.HandshakeFailures()
			gone = append(gone, e)
		}
	}
	h.mu.Unlock()
	for _, k := range shapes {
		h.Warm(k)
	}
	for _, e := range gone {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			if err := e.pool.Close(); err != nil {
				h.log.Warn("close pool", "err", err)
			}
			_ = e.tmpl.Close()
		}()
	}
}

// options returns the VM options of a shape.
func (h *Host) options(k Shape) Options {
	// Get and Warm refused a shape whose image name is not one.
	dir, _ := h.ImageDir(k.Image)
	opts := Options{Runtime: h.cfg.Runtime, ImageDir: dir, MemoryMiB: k.MemoryMiB, CPUs: k.CPUs, DiskMiB: k.DiskMiB, Seccomp: k.Seccomp, Cgroups: h.cgroups}
	if k.Network {
		nc := h.cfg.Network
		opts.Network = &nc
	}
	return opts
}

// Warm loads (or builds) the template of a shape and fills its pool, in
// the background. It does nothing with templates ofh.
func (h *Host) Warm(k Shape) {
	k = k.normal()
	if _, err := h.ImageDir(k.Image); err != nil {
		h.log.Error("not warming a shape", "err", err)
		return
	}
	if !h.cfg.NoTemplate {
		h.entry(k)
	}
}

// entry returns the shape's entry, starting its load (and, when there is
// no template, its build) when new or when a failed build may be retried.
func (h *Host) entry(k Shape) *shapeEntry {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.shapes[k]
	if e != nil && (e.ready || e.failedAt.IsZero() || time.Since(e.failedAt) < e.retry) {
		return e
	}
	failures := 0
	if e != nil {
		failures = e.failures
	}
	if h.ctx.Err() != nil {
		e := &shapeEntry{loaded: make(chan struct{})}
		close(e.loaded)
		return e
	}
	e = &shapeEntry{loaded: make(chan struct{}), failures: failures}
	h.shapes[k] = e
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		h.build(k, e)
	}()
	return e
}

func (h *Host) build(k Shape, e *shapeEntry) {
	opts := h.options(k)
	t0 := time.Now()
	tmpl, err := LoadTemplate(h.ctx, opts)
	if err == nil {
		h.ready(k, e, tmpl, t0)
		close(e.loaded)
		return
	}
	close(e.loaded)
	if errors.Is(err, ErrNoTemplate) {
		h.log.Info("building the VM template of a shape; its requests boot cold meanwhile", "memory_mib", k.MemoryMiB, "cpus", k.CPUs, "disk_mib", k.DiskMiB, "network", k.Network, "why", err)
		select {
		case h.building <- struct{}{}:
			if !h.current(k, e) {
				// Its image moved while it waited (retire): a build
				// would only remove the new image's template of the
				// shape as a stale one.
				<-h.building
				return
			}
			tmpl, err = EnsureTemplate(h.ctx, opts)
			<-h.building
		case <-h.ctx.Done():
			err = h.ctx.Err()
		}
	}
	if err != nil {
		h.mu.Lock()
		e.failures++
		e.failedAt, e.retry = time.Now(), retryAfter(e.failures)
		retry := e.retry
		h.mu.Unlock()
		if h.ctx.Err() == nil {
			h.log.Error("VM template failed; this shape boots cold", "memory_mib", k.MemoryMiB, "cpus", k.CPUs, "disk_mib", k.DiskMiB, "network", k.Network, "err", err, "retry_in", retry)
		}
		return
	}
	h.ready(k, e, tmpl, t0)
}

// current reports whether e is the shape's entry (retire drops it).
func (h *Host) current(k Shape, e *shapeEntry) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.shapes[k] == e
}

// ready starts the shape's pool on its template.
func (h *Host) ready(k Shape, e *shapeEntry, tmpl *Template, t0 time.Time) {
	pool := NewPool(tmpl, h.cfg.PoolSize, h.cfg.Ahead)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx.Err() != nil || h.shapes[k] != e { // closing, or its image moved (retire)
		_ = pool.Close()
		_ = tmpl.Close()
		return
	}
	e.tmpl, e.pool, e.ready = tmpl, pool, true
	h.log.Info("fast path ready", "template", tmpl.String(), "network", k.Network, "built", tmpl.Built, "ms", time.Since(t0).Milliseconds(), "pool_size", h.cfg.PoolSize, "ahead", h.cfg.Ahead)
}

// restore returns a restored VM of the shape and how it was made
// (FromPool, FromRestore), or nil when the shape has no template yet.
func (h *Host) restore(ctx context.Context, k Shape) (*VM, string, error) {
	e := h.entry(k)
	select {
	case <-e.loaded:
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
	h.mu.Lock()
	ready, pool := e.ready, e.pool
	h.mu.Unlock()
	if !ready {
		return nil, "", nil
	}
	v, fromPool, err := pool.Get(ctx)
	if err != nil {
		if ctx.Err() == nil && !hostShortOf(err) {
			h.discard(k, e, err)
		}
		return nil, "", err
	}
	if fromPool {
		return v, FromPool, nil
	}
	return v, FromRestore, nil
}

// hostShortOf reports whether a failed restore ran out of something of
// the host's (disk space, file descriptors, memory, processes), not into
// something wrong with the template: such a failure says nothing about
// the template, which a rebuild would only have to make again, on the
// same full disk.
func hostShortOf(err error) bool {
	for _, e := range []error{syscall.ENOSPC, syscall.EDQUOT, syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.EAGAIN, ErrStateDiskFull} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// discard drops a shape whose restore failed: its pool is closed and its
// template removed, so the next request of the shape starts a rebuild
// (and boots cold meanwhile).
func (h *Host) discard(k Shape, e *shapeEntry, why error) {
	h.mu.Lock()
	if h.shapes[k] != e || !e.ready || h.ctx.Err() != nil {
		h.mu.Unlock()
		return
	}
	delete(h.shapes, k)
	h.pastFailures += e.tmpl.HandshakeFailures()
	h.mu.Unlock()
	h.log.Error("restore from template failed: discarding the template; it is rebuilt on the next request", "template", e.tmpl.String(), "err", why)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		if err := e.pool.Close(); err != nil {
			h.log.Warn("close pool", "err", err)
		}
		if err := e.tmpl.Discard(); err != nil {
			h.log.Warn("remove template", "err", err)
		}
	}()
}

// ShapeStats is what the status reports of a shape whose template is ready.
type ShapeStats struct {
	Shape
	Pool PoolStats
	// HandshakeFailures counts restores whose first agent contact
	// failed (each a failed restore).
	HandshakeFailures int64
}

// Stats returns each ready shape's counters.
func (h *Host) Stats() []ShapeStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []ShapeStats
	for k, e := range h.shapes {
		if e.ready {
			out = append(out, ShapeStats{Shape: k, Pool: e.pool.Stats(), HandshakeFailures: e.tmpl.HandshakeFailures()})
		}
	}
	return out
}

// HandshakeFailures counts, over the Host's life, restores whose first
// agent contact failed.
func (h *Host) HandshakeFailures() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.pastFailures
	for _, e := range h.shapes {
		if e.ready {
			n += e.tmpl.HandshakeFailures()
		}
	}
	return n
}

// Close stops building, destroys pooled VMs, releases templates and
// removes the jails' cgroup. Call it once every VM from Get is closed.
func (h *Host) Close() error {
	h.cancel()
	h.wg.Wait()
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, e := range h.shapes {
		if e.ready {
			if err := e.pool.Close(); err != nil {
				h.log.Warn("close pool", "err", err)
			}
			_ = e.tmpl.Close()
		}
		delete(h.shapes, k)
	}
	var err error
	if h.cgroups != nil {
		if err = h.cgroups.Close(); err != nil {
			err = fmt.Errorf("remove the jails' cgroup: %w", err)
		}
		h.cgroups = nil
	}
	return err
}
