package imagebuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"time"
)

// Bounds of what an import unpacks, so that a tarball (a small
// compressed file can expand to anything) cannot fill the host's disk or
// inode table before mkfs.ext4 would notice. A root file system near
// them does not fit a guest disk anyway.
const (
	// DefaultImportMaxBytes bounds the uncompressed tar stream, and
	// separately the sum of its files' sizes (larger for sparse files).
	DefaultImportMaxBytes = 16 << 30
	// DefaultImportMaxEntries bounds the tarball's entries.
	DefaultImportMaxEntries = 1 << 20
)

// unpackLimits bound one unpack.
type unpackLimits struct {
	bytes   int64
	entries int
}

// errTooLarge reports a tarball, an image or a registry's answer over
// its bounds.
var errTooLarge = errors.New("larger than an import allows")

// decompressors are the compressions unpack knows, by their magic
// number: gzip and bzip2 in Go, xz and zstd by their tools (as GNU tar
// would run them). A tarball with none of these is read as it is.
var decompressors = []struct {
	name  string
	magic []byte
	tool  []string // nil: decompressed in Go
}{
	{"gzip", []byte{0x1f, 0x8b}, nil},
	{"bzip2", []byte("BZh"), nil},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, []string{"xz", "-dc"}},
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}, []string{"zstd", "-dc"}},
}

// unpackOptions say how an import unpacks.
type unpackOptions struct {
	lim unpackLimits
	// keepSetid keeps the set-user-ID and set-group-ID bits of files
	// (--keep-setid); without it they are cleared.
	keepSetid bool
	// owners gives every entry its numeric owner and group (as root).
	owners bool
	log    *slog.Logger
}

// unpack extracts the root file system tarball (plain, or compressed as
// decompressors know) into the directory root (unpacker). It stops, with
// errTooLarge, at the first byte or entry over opt.lim; what it wrote is
// the caller's to remove (Import's build directory).
func unpack(ctx context.Context, tarball, root string, opt unpackOptions) error {
	u, err := newUnpacker(root, opt)
	if err != nil {
		return err
	}
	defer u.close()
	if err := applyTarball(ctx, u, tarball); err != nil {
		return err
	}
	u.report()
	return nil
}

// applyTarball unpacks a root file system tarball into u's root.
func applyTarball(ctx context.Context, u *unpacker, tarball string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer f.Close()
	stream, err := decompress(ctx, f)
	if err != nil {
		return fmt.Errorf("%s: %w", tarball, err)
	}
	applyErr := u.apply(ctx, stream, false)
	if applyErr != nil {
		cancel() // kills a decompressor tool
	}
	decErr := stream.wait(applyErr != nil)
	switch {
	case errors.Is(applyErr, errTooLarge), errors.Is(applyErr, errBadName):
		return fmt.Errorf("%s: %w", tarball, applyErr)
	case decErr != nil: // the cause of what archive/tar saw
		return fmt.Errorf("%s: %w", tarball, decErr)
	case applyErr != nil:
		return fmt.Errorf("%s: %w", tarball, applyErr)
	}
	return nil
}

// unpacker applies tar streams, one after another, to a root directory:
// a root file system tarball, or an image's layers in order. Each
// stream's entries are untrusted: every write goes through an os.Root,
// so that no name, symlink or hard link leads out of the root; a later
// entry through a symlink an earlier one made lands where the guest
// would find it (an absolute target starts at the root; a relative one
// that climbs above it is refused: parent); names with ".."
// elements or absolute ones are refused (entryPath); device nodes and
// FIFOs are skipped, never made on the host; set-id bits are cleared
// unless opt.keepSetid; file capabilities and other extended attributes
// are not unpacked at all. Bytes and entries are counted over all the
// streams against opt.lim.
type unpacker struct {
	root    *os.Root
	opt     unpackOptions
	stream  budget // uncompressed bytes read, over all streams
	entries int
	files   int64 // bytes in files, over all streams
	// resolved maps an entry's directory part to where it is in the
	// root (parent).
	resolved map[string]string
	// What was not unpacked as the stream had it, for report.
	stripped, kept, skipped []string
}

// budget is what is left of a bound shared by several readers.
type budget struct{ left, max int64 }

func newUnpacker(root string, opt unpackOptions) (*unpacker, error) {
	r, err := os.OpenRoot(root)
	if err != nil {
		return nil, err
	}
	if opt.log == nil {
		opt.log = slog.Default()
	}
	return &unpacker{root: r, opt: opt, stream: budget{left: opt.lim.bytes, max: opt.lim.bytes}}, nil
}

func (u *unpacker) close() { u.root.Close() }

// parent is p with its directory part resolved in the root as the guest
// sees it (parentIn, rootpath.go). Resolved directories are kept until
// the tree's links change: a symlink made or anything removed.
func (u *unpacker) parent(p string) (string, error) {
	dir, base := path.Split(p)
	if dir == "" {
		return p, nil
	}
	if d, ok := u.resolved[dir]; ok {
		return path.Join(d, base), nil
	}
	q, err := parentIn(u.root, p)
	if err != nil {
		return "", err
	}
	if u.resolved == nil {
		u.resolved = map[string]string{}
	}
	u.resolved[dir] = path.Dir(q)
	return q, nil
}

// removeAll removes p and what is under it, and forgets the resolved
// directories (a link may have gone).
func (u *unpacker) removeAll(p string) error {
	u.resolved = nil
	return u.root.RemoveAll(p)
}

// apply unpacks one tar stream, read to its end (what follows the
// archive's end is read too, for a decompressor's or a digest's checks).
// With layer set, the stream is an image layer: its whiteouts remove
// what the layers before it hold (layerEntry), as a container runtime
// applies them; what the layer itself holds is never removed by its own
// whiteouts.
func (u *unpacker) apply(ctx context.Context, r io.Reader, layer bool) error {
	br := &boundedReader{r: r, b: &u.stream}
	tr := tar.NewReader(br)
	l := layerState{written: map[string]bool{}}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("not a readable tar archive: %w", err)
		}
		u.entries++
		if u.entries > u.opt.lim.entries {
			return fmt.Errorf("%w: it has more than %d entries", errTooLarge, u.opt.lim.entries)
		}
		if h.Size > u.opt.lim.bytes-u.files {
			return fmt.Errorf("%w: its files hold more than %s", errTooLarge, sizeText(u.opt.lim.bytes))
		}
		u.files += h.Size
		kind, p, err := layerEntry(h.Name, layer)
		if err != nil {
			return err
		}
		if p, err = u.parent(p); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
		if err := u.entry(&l, kind, p, h, tr); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return err
	}
	// Directories' times last: their entries changed them.
	for _, d := range slices.Backward(l.dirs) {
		if fi, err := u.root.Lstat(d.path); err == nil && fi.IsDir() {
			if err := u.root.Chtimes(d.path, d.mtime, d.mtime); err != nil {
				return err
			}
		}
	}
	return nil
}

// layerState is what applying one stream remembers.
type layerState struct {
	// written holds the paths this stream made, and their parents:
	// its whiteouts leave them alone.
	written map[string]bool
	dirs    []dirTime
}

type dirTime struct {
	path  string
	mtime time.Time
}

func (l *layerState) wrote(p string) {
	for ; p != "." && p != "/" && !l.written[p]; p = path.Dir(p) {
		l.written[p] = true
	}
}

// entry does what one tar entry asks.
func (u *unpacker) entry(l *layerState, kind entryKind, p string, h *tar.Header, data io.Reader) error {
	switch kind {
	case entrySkip:
		return nil
	case entryWhiteout:
		if l.written[p] {
			return nil
		}
		return u.removeAll(p)
	case entryOpaque:
		// The directory is the layer's own (overlayfs marks it so), so
		// it is made if the layers below lack it.
		if err := u.root.MkdirAll(p, 0o755); err != nil {
			return err
		}
		l.wrote(p)
		return u.clearLower(l, p)
	}
	switch h.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeGNUSparse, tar.TypeSymlink, tar.TypeLink:
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		u.skipped = append(u.skipped, p)
		return nil
	default:
		u.skipped = append(u.skipped, p)
		u.opt.log.Warn("image import: skipping a tar entry of an unknown type", "entry", h.Name, "type", string(h.Typeflag))
		return nil
	}
	if p == "." {
		if h.Typeflag != tar.TypeDir {
			return errors.New("the root must be a directory")
		}
		return u.meta(l, p, h)
	}
	if err := u.root.MkdirAll(path.Dir(p), 0o755); err != nil {
		return err
	}
	// What is there goes, unless a directory stays a directory.
	if fi, err := u.root.Lstat(p); err == nil && (!fi.IsDir() || h.Typeflag != tar.TypeDir) {
		if err := u.removeAll(p); err != nil {
			return err
		}
	}
	l.wrote(p)
	switch h.Typeflag {
	case tar.TypeDir:
		if err := u.root.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	case tar.TypeReg, tar.TypeGNUSparse: // archive/tar reads a sparse file's holes as zeros
		f, err := u.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		u.resolved = nil
		if err := u.root.Symlink(h.Linkname, p); err != nil {
			return err
		}
	case tar.TypeLink:
		target, err := entryPath(h.Linkname)
		if err == nil {
			target, err = u.parent(target)
		}
		if err != nil {
			return fmt.Errorf("hard link: %w", err)
		}
		return u.root.Link(target, p)
	}
	return u.meta(l, p, h)
}

// setid are the mode bits that give a program its owner's or group's
// rights.
const setid = os.ModeSetuid | os.ModeSetgid

// meta gives p the entry's owner, mode and time. The mode is set after
// the owner: chown clears set-id bits.
func (u *unpacker) meta(l *layerState, p string, h *tar.Header) error {
	if u.opt.owners {
		if err := u.root.Lchown(p, h.Uid, h.Gid); err != nil {
			return err
		}
	}
	if h.Typeflag == tar.TypeSymlink {
		return nil
	}
	mode := h.FileInfo().Mode() & (os.ModePerm | setid | os.ModeSticky)
	if h.Typeflag != tar.TypeDir && mode&setid != 0 {
		if u.opt.keepSetid {
			u.kept = append(u.kept, p)
		} else {
			u.stripped = append(u.stripped, p)
			mode &^= setid
		}
	}
	if err := u.root.Chmod(p, mode); err != nil {
		return err
	}
	if h.Typeflag == tar.TypeDir {
		l.dirs = append(l.dirs, dirTime{p, h.ModTime})
		return nil
	}
	return u.root.Chtimes(p, h.ModTime, h.ModTime)
}

// clearLower makes dir opaque: what the layers below put in it goes,
// what this layer wrote stays.
func (u *unpacker) clearLower(l *layerState, dir string) error {
	fi, err := u.root.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && !fi.IsDir()) {
		return nil
	}
	if err != nil {
		return err
	}
	f, err := u.root.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		c := path.Join(dir, n)
		if !l.written[c] {
			if err := u.removeAll(c); err != nil {
				return err
			}
		} else if err := u.clearLower(l, c); err != nil {
			return err
		}
	}
	return nil
}

// report logs what was not unpacked as the streams had it.
func (u *unpacker) report() {
	first := func(s []string) []string { return s[:min(len(s), 10)] }
	if len(u.stripped) > 0 {
		u.opt.log.Info("image import: set-user-ID and set-group-ID bits cleared (--keep-setid keeps them)",
			"files", len(u.stripped), "first", first(u.stripped))
	}
	if len(u.kept) > 0 {
		u.opt.log.Warn("IMAGE WARNING: set-id files kept (--keep-setid): a command run as an unprivileged guest user may become the guest's root through them",
			"files", len(u.kept), "first", first(u.kept))
	}
	if len(u.skipped) > 0 {
		u.opt.log.Info("image import: device nodes, FIFOs and unknown entries skipped (the guest's /dev is its kernel's)",
			"entries", len(u.skipped), "first", first(u.skipped))
	}
}

// boundedReader reads from r what its budget allows; one byte more is
// errTooLarge.
type boundedReader struct {
	r io.Reader
	b *budget
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.b.left < 0 {
		return 0, b.err()
	}
	if int64(len(p)) > b.b.left+1 {
		p = p[:b.b.left+1]
	}
	n, err := b.r.Read(p)
	b.b.left -= int64(n)
	if b.b.left < 0 {
		return n + int(b.b.left), b.err()
	}
	return n, err
}

func (b *boundedReader) err() error {
	return fmt.Errorf("%w: it unpacks to more than %s", errTooLarge, sizeText(b.b.max))
}

// decompressed is a tarball's uncompressed stream.
type decompressed struct {
	io.Reader
	// wait ends the decompressor (abandon: its output is not read to
	// its end) and reports its failure: a tool's exit with a message.
	wait func(abandon bool) error
}

// decompress returns the uncompressed stream of f, a compressed file as
// decompressors know them, or f itself.
func decompress(ctx context.Context, f *os.File) (decompressed, error) {
	none := func(bool) error { return nil }
	br := bufio.NewReader(f)
	head, _ := br.Peek(8)
	for _, d := range decompressors {
		if !bytes.HasPrefix(head, d.magic) {
			continue
		}
		switch d.name {
		case "gzip":
			z, err := gzip.NewReader(br)
			if err != nil {
				return decompressed{}, fmt.Errorf("gzip: %w", err)
			}
			return decompressed{z, none}, nil
		case "bzip2":
			return decompressed{bzip2.NewReader(br), none}, nil
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return decompressed{}, err
		}
		var errOut tailBuffer
		cmd := exec.CommandContext(ctx, d.tool[0], d.tool[1:]...)
		cmd.Stdin, cmd.Stderr = f, &errOut
		out, err := cmd.StdoutPipe()
		if err != nil {
			return decompressed{}, err
		}
		if err := cmd.Start(); err != nil {
			return decompressed{}, fmt.Errorf("a %s tarball needs %s: %w", d.name, d.tool[0], err)
		}
		return decompressed{out, func(abandon bool) error {
			if abandon {
				out.Close() // a tool still writing gets EPIPE
			}
			err := cmd.Wait()
			if msg := strings.TrimSpace(lastLines(errOut.String(), 3)); err != nil && (msg != "" || !abandon) {
				return fmt.Errorf("%s: %w: %s", d.tool[0], err, msg)
			}
			return nil
		}}, nil
	}
	return decompressed{br, none}, nil
}

// sizeText writes n bytes for a person: whole GiB or MiB when exact.
func sizeText(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}
