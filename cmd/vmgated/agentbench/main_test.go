package agentbench

import (
	"os"
	"testing"

	"github.com/vmgate/vmgate/internal/reexec"
)

// TestMain lets the test binary serve as the jail's re-exec child, as
// vmgated does: the in-process daemon of the integration tests starts
// its VMs' QEMU through it.
func TestMain(m *testing.M) {
	reexec.MaybeRunChild()
	os.Exit(m.Run())
}
