package isolate

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
)

// SeccompInstaller loads the seccomp filter for a spec. It is set by the
// package that provides the filter (isolate/seccomp registers itself), so
// that this package stays free of cgo.
var SeccompInstaller func(accel string, network, incoming bool, log *slog.Logger) error

func loadSeccomp(s *Spec) error {
	if s.Seccomp == "off" {
		fmt.Fprintln(os.Stderr, "vmgate-jail: SECCOMP WARNING: seccomp filter disabled by configuration")
		return nil
	}
	if SeccompInstaller == nil {
		return errors.New("seccomp required but no filter is linked into this build (needs cgo and libseccomp)")
	}
	if err := SeccompInstaller(s.SeccompAccel, s.SeccompNetwork, s.SeccompIncoming, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return nil
}
