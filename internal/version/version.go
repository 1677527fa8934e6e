// Package version says which build of vmgate is running: the module
// version, or the VCS revision the binary was built from, and the Go
// version. Both binaries and the MCP server report it.
package version

import (
	"fmt"
	"runtime/debug"
)

// Info describes a build.
type Info struct {
	Version  string `json:"version"` // module version, or "dev-REV[-dirty]", or "dev"
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

// commit is set by the build (make: -ldflags -X …/version.commit=REV)
// where the Go toolchain does not stamp the VCS revision itself.
var commit string

// Get describes the running binary.
func Get() Info {
	bi, ok := debug.ReadBuildInfo()
	in := of(bi, ok)
	if in.Commit == "" && commit != "" {
		in.Commit = commit
		if in.Version == "dev" {
			in.Version = "dev-" + commit[:min(len(commit), 12)]
		}
	}
	return in
}

func of(bi *debug.BuildInfo, ok bool) Info {
	if !ok || bi == nil {
		return Info{Version: "dev", Go: "unknown"}
	}
	in := Info{Go: bi.GoVersion}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			in.Commit = s.Value
		case "vcs.modified":
			in.Modified = s.Value == "true"
		}
	}
	switch v := bi.Main.Version; {
	case v != "" && v != "(devel)":
		in.Version = v
	case in.Commit != "":
		in.Version = "dev-" + in.Commit[:min(len(in.Commit), 12)]
		if in.Modified {
			in.Version += "-dirty"
		}
	default:
		in.Version = "dev"
	}
	return in
}

// String is the version line a --version prints for program.
func (in Info) String() string {
	s := in.Version
	if in.Commit != "" {
		s += " (commit " + in.Commit
		if in.Modified {
			s += ", modified"
		}
		s += ")"
	}
	return fmt.Sprintf("%s, %s", s, in.Go)
}
