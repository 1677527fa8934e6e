package vm

import (
	"os"
	"testing"

	"github.com/vmgate/vmgate/internal/reexec"
)

// TestMain lets the test binary serve as the jail's re-exec child, as
// vmgated does.
func TestMain(m *testing.M) {
	reexec.MaybeRunChild()
	os.Exit(m.Run())
}
