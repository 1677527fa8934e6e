package seccomp

import (
	"fmt"
	"os"
	"testing"
)

// childEnv selects a child role of the test binary (the
// irreversible Load runs in a re-exec'd test binary, never in the test
// process itself).
const childEnv = "VMGATE_SECCOMP_TEST_CHILD"

// children are the roles; each runs in a fresh process and exits.
var children = map[string]func() int{}

func TestMain(m *testing.M) {
	if name := os.Getenv(childEnv); name != "" {
		fn := children[name]
		if fn == nil {
			fmt.Fprintf(os.Stderr, "unknown child role %q\n", name)
			os.Exit(2)
		}
		os.Exit(fn())
	}
	os.Exit(m.Run())
}
