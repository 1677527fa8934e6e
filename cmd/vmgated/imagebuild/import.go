package imagebuild

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/vmgate/vmgate/guest/netconf"
	"github.com/vmgate/vmgate/vm/image"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// ImportOptions configure Import.
type ImportOptions struct {
	// OutDir is the final image directory. Required.
	OutDir string
	// Source is what the image is made from: a root file system tar
	// archive, compressed or not, such as `docker export` writes; a
	// `docker save` archive; or an OCI image layout, a directory or its
	// tar (openSource tells them apart). Required. For Pull, the
	// reference pulled.
	Source string
	// AgentPath is the static guest agent binary; empty means FindAgent("").
	AgentPath string
	// DiskSizeMiB is the size of the guest's root filesystem (default 4096).
	DiskSizeMiB int
	// Force rebuilds even when an intact image of the same inputs exists.
	Force bool
	// MaxBytes bounds the tarball's uncompressed size, and the size of
	// its files (default DefaultImportMaxBytes); MaxEntries its entries
	// (default DefaultImportMaxEntries). For a container image the
	// bounds are over all its layers (and a pull's downloads). An
	// import over either fails and leaves nothing behind.
	MaxBytes   int64
	MaxEntries int
	// KeepSetid keeps set-user-ID and set-group-ID bits; by default
	// they are cleared (docs/security.md, "Imported images under
	// attack").
	KeepSetid bool
	// Init is how the root starts: InitAgent (or ""), the agent is its
	// init; InitImage, its own systemd is (keepinit.go).
	Init string
	Log  *slog.Logger
	// Progress, when non-nil, receives a human progress display (a TTY).
	Progress io.Writer
}

// importTools are what an import runs.
var importTools = []string{"mkfs.ext4", "qemu-img", "dpkg-deb", "apt-get", "apt-cache"}

// ImportSuite is Inputs.Suite of an imported image.
const ImportSuite = "import"

// limits are the bounds opts set, or the defaults.
func (opts ImportOptions) limits() unpackLimits {
	lim := unpackLimits{bytes: opts.MaxBytes, entries: opts.MaxEntries}
	if lim.bytes <= 0 {
		lim.bytes = DefaultImportMaxBytes
	}
	if lim.entries <= 0 {
		lim.entries = DefaultImportMaxEntries
	}
	return lim
}

// Import makes an image from a root file system tarball or a container
// image (ImportOptions.Source): the same kernel
// and initramfs as a built image (the kernel package comes through the
// host's apt), the agent added to the root, and the agent as
// the root's init (agentproto.RootInitMarker), since such a root has no
// init system. The root gets a fresh unprivileged user "agent" (an entry
// of that name the tarball brings, perhaps uid 0, is replaced: see
// withGuestUser), a resolver and a host name;
// nothing else of it changes, and nothing is written outside it (every
// write goes through an os.Root). Kernel modules beyond the initramfs's
// are not installed: no netfilter or extra file systems in the guest.
//
// The source is unpacked within bounds (ImportOptions.MaxBytes and
// MaxEntries): one over them fails the import, which leaves nothing
// behind. So does a container image that is not what it says (a blob
// whose digest differs from its descriptor's, a media type not known,
// no linux/amd64 variant).
//
// Postcondition: as for Build.
func Import(ctx context.Context, opts ImportOptions) (*Result, error) {
	if opts.Source == "" {
		return nil, errors.New("image import: no source")
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("image import: unpacking a root file system with its owners needs root")
	}
	src, err := openSource(ctx, opts.Source, opts.limits())
	if err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	return importFrom(ctx, opts, src)
}

// importFrom makes the image of an opened source.
func importFrom(ctx context.Context, opts ImportOptions, src *imageSource) (*Result, error) {
	agent, err := FindAgent(opts.AgentPath)
	if err != nil {
		return nil, err
	}
	agentSum, err := image.FileSHA256(agent)
	if err != nil {
		return nil, err
	}
	init, err := initInput(opts.Init)
	if err != nil {
		return nil, err
	}
	in := image.Inputs{BuilderVersion: image.BuilderVersion, Suite: ImportSuite, Import: src.digest, AgentSHA256: agentSum,
		DiskSizeMiB: cmpInt(opts.DiskSizeMiB, 4096), KeepSetid: opts.KeepSetid, Init: init}.Normalize()
	if err := validateInputs(in); err != nil {
		return nil, err
	}
	uo := unpackOptions{lim: opts.limits(), keepSetid: opts.KeepSetid, owners: true}
	if opts.KeepSetid {
		log := opts.Log
		if log == nil {
			log = slog.Default()
		}
		log.Warn("IMAGE WARNING: --keep-setid: set-user-ID and set-group-ID files are kept as the image has them")
	}
	return produce(ctx, job{out: opts.OutDir, in: in, agent: agent, force: opts.Force, log: opts.Log, progress: opts.Progress,
		steps: 6, tools: importTools, make: func(b *builder, ctx context.Context) (*image.Manifest, error) {
			return b.importRoot(ctx, src, uo)
		}})
}

func cmpInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// importRoot runs the steps of an import up to a complete image in b.tmp.
func (b *builder) importRoot(ctx context.Context, src *imageSource, uo unpackOptions) (*image.Manifest, error) {
	if err := b.begin(); err != nil {
		return nil, err
	}
	root := filepath.Join(b.work, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	b.p.step("unpacking " + filepath.Base(src.source.Reference))
	uo.log = b.log
	u, err := newUnpacker(root, uo)
	if err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	err = src.unpack(ctx, u)
	u.close()
	if err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	u.report()
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	defer r.Close()
	if fi, err := statIn(r, "bin/sh"); err != nil || fi.IsDir() {
		return nil, errors.New("image import: the root file system has no /bin/sh; it needs a shell (and the programs your commands run)")
	}
	src.source.Shell = shellOf(r)

	b.p.step("fetching the kernel and writing the initramfs")
	k, err := fetchKernel(b.work, "linux-image-amd64")
	if err != nil {
		return nil, fmt.Errorf("image import: %w (the kernel comes through the host's apt: run apt-get update)", err)
	}
	agentBin, mods, err := writeBootFiles(b.work, k, b.agent, InitrdModules)
	if err != nil {
		return nil, err
	}

	b.p.step("adding the guest agent")
	if err := prepareImported(r, agentBin, b.in.Init); err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	pkgs, err := readPackages(r, maxDpkgStatus)
	if err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	if err := makeFS(root, filepath.Join(b.work, "rootfs.ext4"), b.in.DiskSizeMiB); err != nil {
		return nil, err
	}
	if err := os.RemoveAll(root); err != nil {
		return nil, fmt.Errorf("image import: %w", err)
	}
	names := make([]string, len(mods))
	for i, m := range mods {
		names[i] = m.Name
	}
	source := src.source
	return b.finish(ctx, &customizeResult{KernelVersion: k.version, KernelPackage: k.pkg, Modules: names, Packages: pkgs, Source: &source})
}

// shellOf is the interactive shell the root r offers (image.Source.Shell):
// bash where /bin/bash or /usr/bin/bash is a file, /bin/sh otherwise. A
// link is followed as the guest would (statIn): one that climbs out of r
// counts as missing.
func shellOf(r *os.Root) string {
	for _, p := range []string{"bin/bash", "usr/bin/bash"} {
		if fi, err := statIn(r, p); err == nil && fi.Mode().IsRegular() {
			return image.ShellBash
		}
	}
	return image.ShellSh
}

// prepareImported adds to the root r what vmgate needs: the agent, how it
// starts (init: the marker that makes it the root's init, or the units
// that make the root's own systemd start it), the network's resolver, a
// host name and the guest user (addGuestUser).
func prepareImported(r *os.Root, agentBin []byte, init string) error {
	files := []rootFile{
		{agentproto.AgentBinaryPath, agentBin, 0o755},
		{"/etc/resolv.conf", []byte("nameserver " + netconf.Resolver.String() + "\noptions timeout:2 attempts:2\n"), 0o644},
		{"/etc/hostname", []byte("vmgate\n"), 0o644},
		{"/etc/hosts", []byte("127.0.0.1\tlocalhost\n127.0.1.1\tvmgate\n::1\tlocalhost ip6-localhost ip6-loopback\n"), 0o644},
	}
	var links []rootLink
	switch init {
	case image.InitSystemd:
		if err := checkSystemd(r); err != nil {
			return err
		}
		// An image exported from an import may carry the marker.
		if err := r.Remove(rel(agentproto.RootInitMarker)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		files = append(files, rootFile{agentUnitPath, []byte(agentUnit), 0o644}, rootFile{networkUnitPath, []byte(networkUnit), 0o644},
			rootFile{"/etc/fstab", []byte(rootFstab), 0o644})
		links = systemdLinks()
	default:
		files = append(files, rootFile{agentproto.RootInitMarker, []byte("vmgate-agent is this root's init (vmgated image import)\n"), 0o644})
	}
	for _, f := range files {
		if err := f.write(r); err != nil {
			return err
		}
	}
	for _, l := range links {
		if err := l.make(r); err != nil {
			return err
		}
	}
	return addGuestUser(r)
}

// rel is an absolute path in the guest as a path in its root.
func rel(p string) string { return strings.TrimPrefix(p, "/") }

// rootFile is a file prepareImported writes, replacing what is there.
type rootFile struct {
	path string
	data []byte
	mode os.FileMode
}

func (f rootFile) write(r *os.Root) error {
	p, err := clearIn(r, f.path) // resolv.conf is often a symlink
	if err != nil {
		return err
	}
	if err := r.WriteFile(p, f.data, f.mode); err != nil {
		return err
	}
	return r.Chmod(p, f.mode)
}

// rootLink is a symlink prepareImported makes, replacing what is there.
type rootLink struct{ path, target string }

func (l rootLink) make(r *os.Root) error {
	p, err := clearIn(r, l.path)
	if err != nil {
		return err
	}
	return r.Symlink(l.target, p)
}

// clearIn makes a place in r for the guest's absolute path guest: its
// directory resolved as the guest would (parentIn) and made, and what is
// there removed. It returns the path in r.
func clearIn(r *os.Root, guest string) (string, error) {
	p, err := parentIn(r, rel(guest))
	if err != nil {
		return "", err
	}
	if err := r.MkdirAll(path.Dir(p), 0o755); err != nil {
		return "", err
	}
	return p, r.RemoveAll(p)
}
