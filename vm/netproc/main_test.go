package netproc_test

import (
	"os"
	"testing"

	"github.com/vmgate/vmgate/internal/reexec"
)

// TestMain lets the test binary serve as the jail's and the netstack's
// re-exec child, as vmgated does.
func TestMain(m *testing.M) {
	reexec.MaybeRunChild()
	os.Exit(m.Run())
}
