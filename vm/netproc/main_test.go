package netproc_test

import (
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
)

// TestMain lets the test binary serve as the jail's and the netstack's
// re-exec child, as vmgated does.
func TestMain(m *testing.M) { testutil.Main(m) }
