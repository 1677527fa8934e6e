package version

import (
	"runtime/debug"
	"testing"
)

func TestOf(t *testing.T) {
	rev := "0123456789abcdef0123"
	for _, tc := range []struct {
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{nil, false, "dev"},
		{&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"}}, true, "v1.2.3"},
		{&debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}}, true, "dev-0123456789ab-dirty"},
		{&debug.BuildInfo{GoVersion: "go1.26.8"}, true, "dev"},
		{&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, true, "dev"},
		{&debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}, true, "dev-abc"},
	} {
		if got := of(tc.bi, tc.ok); got.Version != tc.want {
			t.Errorf("%+v: %q, want %q", tc.bi, got.Version, tc.want)
		}
	}
	in := of(&debug.BuildInfo{GoVersion: "go1.26.8", Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}}}, true)
	if s := in.String(); s != "dev-0123456789ab (commit "+rev+"), go1.26.8" {
		t.Errorf("String() = %q", s)
	}
}
