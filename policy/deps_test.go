package policy

import (
	"strings"
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
)

// TestPolicyIsPure: the policy is a parser and a pure decision; whatever
// imports it (the client's tools, policy check) must not link a VM layer
// or a network stack.
func TestPolicyIsPure(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, d := range testutil.Deps(t, nil, "github.com/vmgate/vmgate/policy") {
		if strings.HasPrefix(d, "github.com/vmgate/vmgate/vm") || strings.HasPrefix(d, "github.com/vmgate/vmgate/gateway") ||
			strings.HasPrefix(d, "github.com/vmgate/vmgate/isolate") || strings.Contains(d, "gvisor") {
			t.Errorf("policy depends on %s", d)
		}
	}
}
