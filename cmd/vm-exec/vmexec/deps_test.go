package vmexec

import (
	"slices"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
)

// clientPackages are the only vmgate packages vm-exec may link: the client
// side of the protocol and the MCP server. Like tailscale's depaware
// check, a new import that pulls in daemon code (the VM layer, the jail,
// the policy, the guest network, libseccomp) fails here.
var clientPackages = []string{
	"github.com/vmgate/vmgate/cmd/vm-exec",
	"github.com/vmgate/vmgate/cmd/vm-exec/vmexec",
	"github.com/vmgate/vmgate/cmd/vm-exec/mcpserver",
	"github.com/vmgate/vmgate/gateway/client/shelltool",
	"github.com/vmgate/vmgate/gateway/client",
	"github.com/vmgate/vmgate/gateway/wire",
	"github.com/vmgate/vmgate/internal/bytestr",
	"github.com/vmgate/vmgate/gateway/receipt",
	"github.com/vmgate/vmgate/internal/durable", // receipt's key files
	"github.com/vmgate/vmgate/internal/signum",
	"github.com/vmgate/vmgate/internal/tty",
	"github.com/vmgate/vmgate/internal/names",
	"github.com/vmgate/vmgate/internal/transfer",
	"github.com/vmgate/vmgate/internal/version",
}

func TestClientDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list and go build")
	}
	deps := testutil.Deps(t, []string{"CGO_ENABLED=0"}, "github.com/vmgate/vmgate/cmd/vm-exec")
	for _, d := range deps {
		if strings.HasPrefix(d, "github.com/vmgate/vmgate/") && !slices.Contains(clientPackages, d) {
			t.Errorf("vm-exec links %s, which is not client code", d)
		}
		for _, bad := range []string{"gvisor.dev/", "libseccomp", "golang.org/x/crypto/ssh", "runtime/cgo", "spf13/cobra"} {
			if strings.Contains(d, bad) {
				t.Errorf("vm-exec links %s", d)
			}
		}
	}
	// It builds without cgo, into a static binary.
	testutil.BuildStatic(t, "github.com/vmgate/vmgate/cmd/vm-exec", "")
}
