//go:build !(linux && cgo)

package seccomp

import (
	"bytes"
	"errors"
	"testing"
)

// TestInstall_Unsupported: a build without libseccomp must refuse, never
// run QEMU unfiltered.
func TestInstall_Unsupported(t *testing.T) {
	if err := Install(Options{Accel: "tcg"}, nil); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Install = %v, want ErrUnsupported", err)
	}
	if err := ExportBPF(Options{Accel: "tcg"}, &bytes.Buffer{}); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("ExportBPF = %v, want ErrUnsupported", err)
	}
}
