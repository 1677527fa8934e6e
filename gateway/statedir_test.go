package gateway

import (
	"io/fs"
	"strings"
	"syscall"
	"testing"
	"time"
)

type fakeInfo struct {
	mode fs.FileMode
	uid  uint32
}

func (f fakeInfo) Name() string       { return "state" }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return &syscall.Stat_t{Uid: f.uid} }

func TestStateDirProblem(t *testing.T) {
	tests := []struct {
		name             string
		mode             fs.FileMode
		owner            uint32
		euid             int
		problem, relaxed string // substrings; "" = none
	}{
		{"own 0700", fs.ModeDir | 0o700, 1000, 1000, "", ""},
		{"own 0755", fs.ModeDir | 0o755, 1000, 1000, "", ""},
		{"root's", fs.ModeDir | 0o755, 0, 1000, "", ""},
		{"service user's, used by root", fs.ModeDir | 0o755, 999, 0, "", "owned by uid 999"},
		{"another user's", fs.ModeDir | 0o700, 1001, 1000, "owned by uid 1001", ""},
		{"world-writable /tmp style", fs.ModeDir | fs.ModeSticky | 0o777, 0, 1000, "mode 0777", ""},
		{"group-writable", fs.ModeDir | 0o770, 1000, 1000, "mode 0770", ""},
		{"group-writable as root", fs.ModeDir | 0o775, 0, 0, "mode 0775", ""},
		{"a file", 0o600, 1000, 1000, "not a directory", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, r := stateDirProblem(fakeInfo{tt.mode, tt.owner}, tt.euid)
			if (p == "") != (tt.problem == "") || !strings.Contains(p, tt.problem) {
				t.Errorf("problem %q, want %q", p, tt.problem)
			}
			if (r == "") != (tt.relaxed == "") || !strings.Contains(r, tt.relaxed) {
				t.Errorf("relaxation %q, want %q", r, tt.relaxed)
			}
		})
	}
}
