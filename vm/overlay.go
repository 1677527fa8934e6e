package vm

import (
	"bytes"
	"context"
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
// its own new file.

type overlayKey struct {
	path       string
	dev, ino   uint64
	size       int64
	modifiedNS int64
}

var blankOverlays = struct {
	sync.Mutex
	m map[overlayKey][]byte
}{m: map[overlayKey][]byte{}}

// maxBlankOverlays bounds the cache: one entry per image base (and per
// rebuild of one).
const maxBlankOverlays = 64

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
	k, err := keyOf(base)
	if err != nil {
		return err
	}
	// Only an image's base is cached: it serves every VM of the image. A
	// save point's disk serves one resume or one fork, and a daemon that
	// pauses and resumes for months would keep one entry for each.
	cache := sizeMiB == 0
	blankOverlays.Lock()
	blank, ok := blankOverlays.m[k]
	blankOverlays.Unlock()
	if !ok || !cache {
		if blank, err = makeBlankOverlay(ctx, base, filepath.Dir(overlay), sizeMiB); err != nil {
			return err
		}
	}
	if !ok && cache {
		blankOverlays.Lock()
		if len(blankOverlays.m) >= maxBlankOverlays {
			clear(blankOverlays.m) // images replaced many times over
		}
		blankOverlays.m[k] = blank
		blankOverlays.Unlock()
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
