package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/image"
)

// binary returns the path of a built command from VMGATE_TEST_BIN.
func binary(t *testing.T, name string) string {
	t.Helper()
	return testutil.Binary(t, name)
}

func runCmd(t *testing.T, env []string, name string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if env != nil {
		cmd.Env = env
	}
	return testutil.Run(t, cmd)
}

// TestImageArtifacts checks the image `make test` built: a qcow2 that
// qemu-img reads, kernel and initrd present, manifest digests true.
func TestImageArtifacts(t *testing.T) {
	img := testutil.RequiresImage(t)
	m, err := image.ReadManifest(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Verify(img, true); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("qemu-img", "info", "--output=json", filepath.Join(img, image.BaseFile)).Output()
	if err != nil {
		t.Fatalf("qemu-img info: %v", err)
	}
	var info struct {
		Format      string `json:"format"`
		VirtualSize int64  `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.Format != "qcow2" || info.VirtualSize < 1<<30 {
		t.Fatalf("base image: %+v", info)
	}
	if m.KernelVersion == "" || !strings.HasPrefix(m.KernelPackage, "linux-image-") {
		t.Fatalf("kernel in manifest: %q %q", m.KernelVersion, m.KernelPackage)
	}
	have := map[string]bool{}
	for _, p := range m.Packages {
		have[p.Name] = true
	}
	for _, want := range image.DefaultPackages {
		if !have[want] {
			t.Errorf("package %s missing from the image", want)
		}
	}
	for _, mod := range []string{"virtio_mmio", "virtio_blk", "virtio_console", "ext4"} {
		found := false
		for _, x := range m.Modules {
			found = found || x == mod
		}
		if !found {
			t.Errorf("initramfs lacks module %s (has %v)", mod, m.Modules)
		}
	}
}

// TestImageBuildIsCached runs the build again on the unchanged image: it
// must keep the image (same manifest, same build time) and say so.
func TestImageBuildIsCached(t *testing.T) {
	img := testutil.RequiresImage(t)
	bin := binary(t, "vmgated")
	before, err := os.ReadFile(filepath.Join(img, image.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	so, se, code := runCmd(t, nil, bin, "image", "build", "--out", img)
	if code != 0 || !strings.Contains(so, "up to date") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, so, se)
	}
	after, err := os.ReadFile(filepath.Join(img, image.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Fatal("a cached build rewrote the manifest")
	}
}

func TestImageBuildErrors(t *testing.T) {
	bin := binary(t, "vmgated")
	agent := filepath.Join(filepath.Dir(bin), "vmgate-agent")
	dir := t.TempDir()
	out := filepath.Join(dir, "img")
	// No build tools on PATH: one error naming them, nothing created.
	_, se, code := runCmd(t, []string{"PATH=" + dir}, bin, "image", "build", "--out", out, "--agent", agent)
	if code == 0 || !strings.Contains(se, "missing tools: mmdebstrap") {
		t.Fatalf("exit %d stderr %q", code, se)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("failed build left %v", ents)
	}
	_, se, code = runCmd(t, nil, bin, "image", "build", "--out", out, "--agent", agent, "--packages", "curl,--hook=x")
	if code == 0 || !strings.Contains(se, "invalid package name") {
		t.Fatalf("exit %d stderr %q", code, se)
	}
	_, se, code = runCmd(t, nil, bin, "image", "build", "--out", out, "--agent", "/bin/sh")
	if code == 0 || !strings.Contains(se, "dynamically linked") {
		t.Fatalf("exit %d stderr %q", code, se)
	}
	_, se, code = runCmd(t, nil, bin, "image", "frobnicate")
	if code != wire.ExitUsage || !strings.Contains(se, "unknown command") {
		t.Fatalf("exit %d stderr %q", code, se)
	}
}

// TestDebugRun is the acceptance path: a fresh VM runs the command, its
// output streams and exit code come back, and the VM is removed.
func TestDebugRun(t *testing.T) {
	img := testutil.RequiresImage(t)
	bin := binary(t, "vmgated")
	state := t.TempDir()
	so, se, code := runCmd(t, nil, bin, "debug", "run", "--image", img, "--state-dir", state, "--disk-mib", "100", "--",
		"sh", "-c", "uname -a; stat -f -c '%a %S' /; echo to-stderr >&2; exit 3")
	if code != 3 {
		t.Fatalf("exit %d, want 3\nstdout: %s\nstderr: %s", code, so, se)
	}
	lines := strings.Split(so, "\n")
	if !strings.HasPrefix(so, "Linux vmgate ") || len(lines) < 2 {
		t.Fatalf("stdout %q", so)
	}
	// --disk-mib bounds what the guest may write.
	var avail, bsize int64
	if _, err := fmt.Sscanf(lines[1], "%d %d", &avail, &bsize); err != nil || avail*bsize > 100<<20 || avail*bsize < 75<<20 {
		t.Errorf("guest's space to write: %q (%v), want a little under 100 MiB", lines[1], err)
	}
	if !strings.Contains(se, "to-stderr") {
		t.Fatalf("stderr %q", se)
	}
	ents, _ := os.ReadDir(filepath.Join(state, "vms"))
	if len(ents) != 0 {
		t.Fatalf("leftover VM directories: %v", ents)
	}
	_, se, code = runCmd(t, nil, bin, "debug", "run", "--image", filepath.Join(state, "nope"), "--state-dir", state, "--", "true")
	if code != 205 || !strings.Contains(se, "image build") {
		t.Fatalf("missing image: exit %d stderr %q", code, se)
	}
	_, _, code = runCmd(t, nil, bin, "debug", "run", "--image", img)
	if code != wire.ExitUsage {
		t.Fatalf("no program: exit %d", code)
	}
}

// TestDebugRun_ThroughSymlinks: debug run with its image and state
// directories each reached through a symlink (a data disk, an
// image -> image-2026-12 link) runs the command. Before, QEMU was given
// the links' paths, which its jail does not have: "Could not open
// '/srv/img-current/base.qcow2'", "Failed to bind socket to
// /srv/state/vms/ID/agent.sock". A link that leads nowhere is named, with
// its target and the fix, before any VM starts.
func TestDebugRun_ThroughSymlinks(t *testing.T) {
	img := testutil.RequiresImage(t)
	bin := binary(t, "vmgated")
	state, links := t.TempDir(), t.TempDir()
	for target, link := range map[string]string{img: "img-current", state: "state", filepath.Join(links, "img-2026-12"): "dangling"} {
		if err := os.Symlink(target, filepath.Join(links, link)); err != nil {
			t.Fatal(err)
		}
	}
	so, se, code := runCmd(t, nil, bin, "debug", "run", "--image", filepath.Join(links, "img-current"), "--state-dir", filepath.Join(links, "state"), "--",
		"echo", "through the links")
	if code != 0 || so != "through the links\n" {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, so, se)
	}
	if ents, _ := os.ReadDir(filepath.Join(state, "vms")); len(ents) != 0 {
		t.Fatalf("leftover VM directories: %v", ents)
	}
	_, se, code = runCmd(t, nil, bin, "debug", "run", "--image", filepath.Join(links, "dangling"), "--state-dir", filepath.Join(links, "state"), "--", "true")
	if want := filepath.Join(links, "dangling") + " is a symlink to " + filepath.Join(links, "img-2026-12") + ", which does not exist: point the link at an existing directory"; code != wire.ExitVMFailed || !strings.Contains(se, want) {
		t.Fatalf("a dangling image link: exit %d, stderr %q, want %q", code, se, want)
	}
}

func TestPolicyCheck(t *testing.T) {
	bin := binary(t, "vmgated")
	so, se, code := runCmd(t, nil, bin, "policy", "check", "../../../contrib/policy/example.toml")
	if code != 0 || !strings.Contains(so, "valid") || !strings.Contains(so, "web-fetch") {
		t.Fatalf("example policy: %d %q %q", code, so, se)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("version = 1\n\n[[profile]]\nname = \"x\"\nmatch = { any = true }\ntimeout = 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, se, code = runCmd(t, nil, bin, "policy", "check", bad)
	if code == 0 || !strings.Contains(se, "bad.toml:6") {
		t.Fatalf("type error should name line 6: %d %q", code, se)
	}
}
