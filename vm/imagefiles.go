package vm

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmgate/vmgate/vm/image"
)

// imageFiles are the files of a checked image that QEMU uses.
type imageFiles struct {
	base, kernel, initrd string
	diskMiB              int // the virtual disk's size
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
		diskMiB: m.Inputs.DiskSizeMiB,
		base:    filepath.Join(abs, image.BaseFile),
		kernel:  filepath.Join(abs, image.KernelFile),
		initrd:  filepath.Join(abs, image.InitrdFile),
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
