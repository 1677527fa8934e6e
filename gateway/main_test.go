package gateway

import (
	"os"
	"testing"

	"github.com/vmgate/vmgate/isolate"
)

// TestMain lets the test binary serve as the jail's re-exec child, as
// vmgated does.
func TestMain(m *testing.M) {
	isolate.MaybeRunChild()
	os.Exit(m.Run())
}
