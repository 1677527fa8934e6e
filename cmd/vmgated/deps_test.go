package main

import (
	"path"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
)

// TestNoTestHarness: the daemon's binary links no test harness: not the
// testing package, nor internal/testutil, nor any of vmgate's *test
// packages (gateway/gatewaytest: the benchmarks' in-process daemon is
// gateway/inproc). A test helper that finds its way into a production
// package fails here.
func TestNoTestHarness(t *testing.T) {
	deps := testutil.Deps(t, nil, "github.com/vmgate/vmgate/cmd/vmgated")
	if len(deps) == 0 {
		t.Fatal("go list -deps listed nothing")
	}
	for _, d := range deps {
		own, ok := strings.CutPrefix(d, "github.com/vmgate/vmgate/")
		switch {
		case d == "testing":
			t.Errorf("vmgated links %s", d)
		case ok && (strings.HasPrefix(own, "internal/testutil") || strings.HasSuffix(path.Base(own), "test")):
			t.Errorf("vmgated links the test package %s", d)
		}
	}
}
