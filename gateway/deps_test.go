package gateway

import (
	"os/exec"
	"strings"
	"testing"
)

// TestGatewayLayers: the daemon gets its VMs from vm.Host and its
// decisions from policy; it does not reach below them (the jail, the
// cgroups, the image builder), so those stay the vm package's business.
func TestGatewayLayers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}}`, "github.com/vmgate/vmgate/gateway").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/vmgate/vmgate/"
	for _, d := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(d, mod)
		if !ok {
			continue
		}
		switch {
		case rel == "vm", rel == "vm/netstack", rel == "policy", rel == "policy/netrule", strings.HasPrefix(rel, "internal/"),
			strings.HasPrefix(rel, "gateway/"):
		default:
			t.Errorf("gateway imports %s; it may use vm (with vm/netstack's policy type), policy, the leaves and its own packages", d)
		}
	}
}
