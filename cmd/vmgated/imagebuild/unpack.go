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
	"os"
	"os/exec"
	"strings"
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

// errTooLarge reports a tarball over its unpackLimits.
var errTooLarge = errors.New("the tarball is larger than an import allows")

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

// unpack extracts the tarball (plain, or compressed as decompressors
// know) into the directory root with GNU tar, keeping numeric owners and
// permissions. GNU tar reads the uncompressed stream from vmgated, which
// walks the same bytes with archive/tar and stops, with errTooLarge, at
// the first byte or entry over lim: tar is killed and what it wrote is
// the caller's to remove (Import's build directory). tar sees exactly the
// bytes archive/tar read, up to the archive's end.
func unpack(ctx context.Context, tarball, root string, lim unpackLimits) error {
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
	var tarOut tailBuffer
	cmd := exec.CommandContext(ctx, "tar", "--numeric-owner", "--same-permissions", "-xf", "-", "-C", root)
	cmd.Stdout, cmd.Stderr = &tarOut, &tarOut
	stdin, err := cmd.StdinPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		cancel()
		_ = stream.wait(true)
		return fmt.Errorf("tar: %w", err)
	}
	counted := &boundedReader{r: stream, left: lim.bytes, max: lim.bytes}
	in := &writeTracker{w: stdin}
	walkErr := walkTar(io.TeeReader(counted, in), lim)
	if walkErr == nil {
		// What follows the archive's end (the padding of its last
		// record) is read for the decompressor's own checks (gzip's
		// CRC, xz's exit status), not given to tar.
		_, walkErr = io.Copy(io.Discard, counted)
	}
	if walkErr != nil {
		cancel() // kills tar and a decompressor tool, wherever they are
	}
	stdin.Close()
	tarErr := cmd.Wait()
	decErr := stream.wait(walkErr != nil)
	switch {
	case errors.Is(walkErr, errTooLarge):
		return fmt.Errorf("%s: %w", tarball, walkErr)
	case decErr != nil: // the cause of what tar or archive/tar saw
		return fmt.Errorf("%s: %w", tarball, decErr)
	case tarErr != nil && (in.err != nil || walkErr == nil):
		return fmt.Errorf("tar: %w: %s", tarErr, lastLines(tarOut.String(), 10))
	case walkErr != nil:
		return fmt.Errorf("%s: not a readable tar archive: %w", tarball, walkErr)
	}
	return nil
}

// writeTracker keeps the first error of writes to w.
type writeTracker struct {
	w   io.Writer
	err error
}

func (t *writeTracker) Write(p []byte) (int, error) {
	n, err := t.w.Write(p)
	if err != nil && t.err == nil {
		t.err = err
	}
	return n, err
}

// walkTar reads a tar stream to its end, refusing more entries, or more
// bytes in its files, than lim allows.
func walkTar(r io.Reader, lim unpackLimits) error {
	tr := tar.NewReader(r)
	var entries int
	var size int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		entries++
		if entries > lim.entries {
			return fmt.Errorf("%w: it has more than %d entries", errTooLarge, lim.entries)
		}
		if h.Size > lim.bytes-size {
			return fmt.Errorf("%w: its files hold more than %s", errTooLarge, sizeText(lim.bytes))
		}
		size += h.Size
	}
}

// boundedReader reads at most max bytes of r; one byte more is
// errTooLarge.
type boundedReader struct {
	r         io.Reader
	left, max int64
}

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.err()
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n + int(b.left), b.err()
	}
	return n, err
}

func (b *boundedReader) err() error {
	return fmt.Errorf("%w: it unpacks to more than %s", errTooLarge, sizeText(b.max))
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
