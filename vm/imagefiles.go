package vm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/vmgate/vmgate/vm/image"
)

// imageFiles are the files of a checked image that QEMU uses.
type imageFiles struct {
	base, kernel, initrd string
	kernelDigest         string // the manifest's
	diskMiB              int    // the virtual disk's size
}

// qemuFiles are the image files QEMU opens: the jail shows it those and
// nothing else of the image.
func (img *imageFiles) qemuFiles() []string { return []string{img.base, img.kernel, img.initrd} }

// loadImage checks the image before QEMU starts, so a missing or damaged
// image is reported as such and not as a failed boot.
func loadImage(dir string) (*imageFiles, error) {
	if dir == "" {
		return nil, errors.New("no image directory configured")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	m, err := image.ReadManifest(abs)
	if err != nil {
		return nil, err
	}
	if err := m.CheckRunnable(abs); err != nil {
		return nil, err
	}
	if err := m.Verify(abs, false); err != nil {
		return nil, err
	}
	if err := checkQcow2(filepath.Join(abs, image.BaseFile)); err != nil {
		return nil, err
	}
	return &imageFiles{
		diskMiB:      m.Inputs.DiskSizeMiB,
		kernelDigest: m.Artifacts[image.KernelFile].SHA256,
		base:         filepath.Join(abs, image.BaseFile),
		kernel:       filepath.Join(abs, image.KernelFile),
		initrd:       filepath.Join(abs, image.InitrdFile),
	}, nil
}

// checkQcow2 verifies the qcow2 magic, catching a truncated or replaced base
// image before QEMU does.
func checkQcow2(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("image: %w", err)
	}
	defer f.Close()
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil || string(magic[:]) != "QFI\xfb" {
		return fmt.Errorf("image: %s is not a qcow2 file", path)
	}
	return nil
}

// kernelStub is what a restored VM's QEMU is given as its kernel: the
// kernel's setup header and a page of nothing, or nil when the kernel is
// no bzImage (then the kernel itself). QEMU reads the whole -kernel file
// into its own memory for fw_cfg, to boot it (8 MiB of a Debian kernel,
// private to every VM); a restored guest is never booted (its kernel is
// in its RAM, and a reset ends QEMU: -no-reboot), so the stub, with the
// same header and so the same option ROM and load addresses, is enough.
// The stub of each kernel (by its digest) is made once.
func (img *imageFiles) kernelStub() []byte {
	if v, ok := kernelStubs.Load(img.kernelDigest); ok {
		return v.([]byte)
	}
	stub := bzImageStub(img.kernel)
	kernelStubs.Store(img.kernelDigest, stub)
	return stub
}

var kernelStubs sync.Map // kernel digest -> stub ([]byte, nil for none)

// bzImageStub reads the boot sector and setup of the bzImage at path and
// returns them with one 512-byte sector of zeros as the kernel (its size,
// syssize, set to match); nil if path is no bzImage.
func bzImageStub(path string) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	hdr := make([]byte, 1024)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil
	}
	return stubOf(hdr, f)
}

// stubOf makes a bzImage stub from its first 1024 bytes hdr and the rest
// of it r (pure but for reading r): nil if it is no bzImage.
func stubOf(hdr []byte, r io.Reader) []byte {
	const (
		setupSects = 0x1f1
		sysSize    = 0x1f4
		bootFlag   = 0x1fe
		magic      = 0x202
		sector     = 512
	)
	if len(hdr) < 1024 || binary.LittleEndian.Uint16(hdr[bootFlag:]) != 0xaa55 || string(hdr[magic:magic+4]) != "HdrS" {
		return nil
	}
	sects := int(hdr[setupSects])
	if sects == 0 {
		sects = 4
	}
	setup := (sects + 1) * sector
	stub := make([]byte, setup+sector)
	copy(stub, hdr)
	if setup > len(hdr) {
		if _, err := io.ReadFull(r, stub[len(hdr):setup]); err != nil {
			return nil
		}
	}
	binary.LittleEndian.PutUint32(stub[sysSize:], sector/16)
	return stub
}
