package cli

import (
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
)

// TestMain lets the test binary serve as the jail's re-exec child, as
// vmgated does: the in-process daemon of the integration tests starts
// its VMs' QEMU through it.
func TestMain(m *testing.M) { testutil.Main(m) }
