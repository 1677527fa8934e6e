//go:build !(linux && cgo)

package seccomp

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
)

// errNoLibseccomp is what Install and ExportBPF return in builds without
// libseccomp. It wraps errors.ErrUnsupported: policy demands seccomp, so
// the jail must fail rather than start QEMU unfiltered.
var errNoLibseccomp = fmt.Errorf("seccomp required but this build has no libseccomp (needs linux and cgo): %w", errors.ErrUnsupported)

// Install fails: this build has no libseccomp.
func Install(opts Options, log *slog.Logger) error { return errNoLibseccomp }

// ExportBPF fails: this build has no libseccomp.
func ExportBPF(opts Options, w io.Writer) error { return errNoLibseccomp }
