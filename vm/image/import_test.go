package image

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestFreeID(t *testing.T) {
	for _, tc := range []struct {
		passwd, group string
		want          int
	}{
		{"", "", 1000},
		{"root:x:0:0::/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\n", "node:x:1000:\n", 1001},
		{"a:x:1000:1001::/:/bin/sh\n", "b:x:1002:\n", 1003},
	} {
		if got := freeID(tc.passwd, tc.group); got != tc.want {
			t.Errorf("freeID(%q, %q) = %d, want %d", tc.passwd, tc.group, got, tc.want)
		}
	}
}

func TestPrepareImported(t *testing.T) {
	dir := t.TempDir()
	for p, c := range map[string]string{"etc/passwd": "root:x:0:0:root:/root:/bin/sh", "etc/group": "root:x:0:"} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A symlink out of the root is not followed: the write fails, the
	// host is untouched.
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := prepareImported(r, []byte("agent")); err == nil {
		t.Fatal("prepareImported wrote through a symlink that leaves the root")
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written outside the root: %v", ents)
	}
	if err := os.Remove(filepath.Join(dir, "usr")); err != nil {
		t.Fatal(err)
	}
	if err := prepareImported(r, []byte("agent")); err != nil {
		t.Fatal(err)
	}
	passwd, _ := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	if !strings.Contains(string(passwd), "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000::/home/agent:/bin/sh\n") {
		t.Errorf("passwd:\n%s", passwd)
	}
	for _, p := range []string{"usr/local/sbin/vmgate-agent", "etc/vmgate/agent-is-init", "home/agent"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Error(err)
		}
	}
	// A second run changes nothing in passwd.
	if err := prepareImported(r, []byte("agent")); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "etc/passwd")); string(again) != string(passwd) {
		t.Errorf("passwd changed on a second run:\n%s", again)
	}
}

func TestProgressRender(t *testing.T) {
	p := newProgress(nil, slog.New(slog.NewTextHandler(io.Discard, nil)), 5)
	p.step("keys")
	p.step("building root filesystem (mmdebstrap bookworm)")
	w := &lines{fn: p.detail}
	_, _ = io.WriteString(w, "Unpacking a (1)\nSetting up a (1) ...\nSetting up b (2) ...\rpartial")
	got := p.render(83 * time.Second)
	want := "████░░░░░░░░░░░░░░░░ 2/5 1m23s building root filesystem (mmdebstrap bookworm): 2 packages set up · Setting up…"
	if got != want {
		t.Errorf("render:\n%q\nwant\n%q", got, want)
	}
	p.stop()
}
