package vm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// Overlays. Every VM gets a new, empty qcow2 overlay on its backing file
// (the base image, or a template's frozen disk). An empty overlay depends
// only on the backing file's path and virtual size, so the first one made
// for a backing file (by qemu-img, once) is kept in memory, and every
// later one is a copy of those bytes: a file write instead of a qemu-img
// process (23 ms under load). The cached bytes are keyed by the backing
// file's path, device, inode, size and modification time, so a rebuilt
// image or template gets overlays of its own; each VM's overlay is still
// its own new file. Overlays on save points' disks (a resume's, a fork's
// copies') are copies of one blank overlay per disk size, with their own
// backing file's name (savePointBlank).

type overlayKey struct {
	path       string
	dev, ino   uint64
	size       int64
	modifiedNS int64
}

// blankCache keeps blank overlays by a key: imageBlanks by an image's
// base, sizeBlanks by a save point's disk size (savePointBlank).
type blankCache[K comparable] struct {
	mu sync.Mutex
	m  map[K][]byte
}

var (
	imageBlanks blankCache[overlayKey]
	sizeBlanks  blankCache[int]
)

// maxBlankOverlays bounds a cache: one entry per image base (and per
// rebuild of one), or per disk size.
const maxBlankOverlays = 64

func (c *blankCache[K]) get(k K) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.m[k]
	return b, ok
}

// put keeps b for k; a cache at its bound starts again (images or disk
// sizes replaced many times over).
func (c *blankCache[K]) put(k K, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxBlankOverlays {
		c.m = map[K][]byte{}
	}
	c.m[k] = b
}

func (c *blankCache[K]) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// maxBlankOverlay bounds a cached blank overlay: one for a 4 GiB disk is
// 192 KiB (header, refcounts, L1 table).
const maxBlankOverlay = 4 << 20

func keyOf(base string) (overlayKey, error) {
	fi, err := os.Stat(base)
	if err != nil {
		return overlayKey{}, fmt.Errorf("create overlay: %w", err)
	}
	k := overlayKey{path: base, size: fi.Size(), modifiedNS: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		k.dev, k.ino = uint64(st.Dev), st.Ino
	}
	return k, nil
}

// createOverlay writes a new empty overlay at overlay on base.
func createOverlay(ctx context.Context, base, overlay string) error {
	return createOverlayOf(ctx, base, overlay, 0)
}

// createOverlayOf writes a new empty overlay at overlay on backing. With a
// size (MiB, the image's virtual disk), qemu-img never opens backing: a
// save point's disk was written by a VM's QEMU, which a guest may have
// taken over, and is parsed by QEMU in its jail only.
func createOverlayOf(ctx context.Context, base, overlay string, sizeMiB int) error {
	var blank []byte
	var err error
	if sizeMiB == 0 {
		blank, err = imageBlank(ctx, base, filepath.Dir(overlay))
	} else {
		blank, err = savePointBlank(ctx, base, filepath.Dir(overlay), sizeMiB)
	}
	if err != nil {
		return err
	}
	f, err := os.OpenFile(overlay, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create overlay: %w", err)
	}
	if _, err := f.Write(blank); err != nil {
		f.Close()
		return fmt.Errorf("create overlay: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("create overlay: %w", err)
	}
	return nil
}

// imageBlank is the blank overlay on an image's base, made in dir the
// first time and then kept: it serves every VM of the image.
func imageBlank(ctx context.Context, base, dir string) ([]byte, error) {
	k, err := keyOf(base)
	if err != nil {
		return nil, err
	}
	if blank, ok := imageBlanks.get(k); ok {
		return blank, nil
	}
	blank, err := makeBlankOverlay(ctx, base, dir, 0)
	if err != nil {
		return nil, err
	}
	imageBlanks.put(k, blank)
	return blank, nil
}

// savePointBlank is a blank overlay of sizeMiB on a save point's disk,
// backing. A save point's disk serves one resume or one fork, and a daemon
// that pauses and resumes for months would keep an entry for each; but
// the overlays on them differ in the backing file's name alone, so one
// made by qemu-img (in dir) is kept per size, and the others are copies of
// it with their own name (withBacking): a copy instead of a qemu-img
// process on every resume and every fork's copy.
func savePointBlank(ctx context.Context, backing, dir string, sizeMiB int) ([]byte, error) {
	if _, err := os.Stat(backing); err != nil {
		return nil, fmt.Errorf("create overlay: %w", err)
	}
	kept, ok := sizeBlanks.get(sizeMiB)
	if ok {
		if b, err := withBacking(kept, backing); err == nil {
			return b, nil
		}
		// A name withBacking cannot place: qemu-img makes this one.
	}
	b, err := makeBlankOverlay(ctx, backing, dir, sizeMiB)
	if err != nil || ok {
		return b, err
	}
	sizeBlanks.put(sizeMiB, b)
	return b, nil
}

// maxBackingName is the longest backing file name a qcow2 image may
// have (QEMU's limit).
const maxBackingName = 1023

// withBacking returns a copy of blank, an empty qcow2 overlay that
// qemu-img made, naming backing as its backing file instead. qemu-img
// writes the name last in the image's first cluster (after the header and
// its extensions), and the overlays it makes for two names differ only in
// the name and its length (header bytes 16-19); withBacking refuses an
// image laid out otherwise: a name not in the first cluster, or
// anything after it there.
func withBacking(blank []byte, backing string) ([]byte, error) {
	if len(blank) < 24 || !bytes.HasPrefix(blank, []byte("QFI\xfb")) {
		return nil, errors.New("not a qcow2 image")
	}
	off := binary.BigEndian.Uint64(blank[8:16])
	n := uint64(binary.BigEndian.Uint32(blank[16:20]))
	bits := binary.BigEndian.Uint32(blank[20:24])
	if bits < 9 || bits > 21 {
		return nil, fmt.Errorf("cluster bits %d", bits)
	}
	cluster := uint64(1) << bits
	switch {
	case off < 24 || off+n > cluster || cluster > uint64(len(blank)):
		return nil, fmt.Errorf("backing file name at %d (%d bytes) is not in the first cluster", off, n)
	case len(bytes.TrimLeft(blank[off+n:cluster], "\x00")) > 0:
		return nil, errors.New("something follows the backing file name in the first cluster")
	case backing == "" || len(backing) > maxBackingName || off+uint64(len(backing)) > cluster:
		return nil, fmt.Errorf("a backing file name of %d bytes", len(backing))
	}
	b := bytes.Clone(blank)
	clear(b[off:cluster])
	copy(b[off:], backing)
	binary.BigEndian.PutUint32(b[16:20], uint32(len(backing)))
	return b, nil
}

// makeBlankOverlay runs qemu-img once for base, in dir, and returns the
// overlay's bytes; with a size (MiB) it does not open base.
func makeBlankOverlay(ctx context.Context, base, dir string, sizeMiB int) ([]byte, error) {
	tmp := filepath.Join(dir, ".blank-overlay-"+newID())
	defer os.Remove(tmp)
	var out bytes.Buffer
	args := []string{"create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", base}
	if sizeMiB > 0 {
		args = append(args, "-u", tmp, strconv.Itoa(sizeMiB)+"M")
	} else {
		args = append(args, tmp)
	}
	cmd := exec.CommandContext(ctx, "qemu-img", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(out.String())
		// A full disk is the host's shortage, not the backing file's
		// fault: say so in a form errors.Is finds (Host keeps the template).
		if strings.Contains(strings.ToLower(msg), syscall.ENOSPC.Error()) {
			err = fmt.Errorf("%w (%w)", err, syscall.ENOSPC)
		}
		return nil, fmt.Errorf("create overlay: %w: %s", err, msg)
	}
	b, err := os.ReadFile(tmp)
	switch {
	case err != nil:
		return nil, fmt.Errorf("create overlay: %w", err)
	case len(b) > maxBlankOverlay || !bytes.HasPrefix(b, []byte("QFI\xfb")):
		return nil, fmt.Errorf("create overlay: qemu-img made %d bytes that are not a small qcow2 overlay", len(b))
	}
	return b, nil
}
