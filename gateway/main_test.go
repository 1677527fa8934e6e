package gateway

import (
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
)

// TestMain lets the test binary serve as the jail's re-exec child, as
// vmgated does.
func TestMain(m *testing.M) { testutil.Main(m) }
