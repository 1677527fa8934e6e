package gateway_test

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/ssh"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/sshfront"
	"github.com/vmgate/vmgate/internal/testutil"
)

// busyboxRoot writes a root file system of the host's static busybox, as
// a tarball such as docker export writes.
func busyboxRoot(t *testing.T) string {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal("busybox (Debian: busybox-static) is needed to make a root file system to import")
	}
	root := filepath.Join(t.TempDir(), "root")
	for _, d := range []string{"bin", "etc", "tmp", "root", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", bb, filepath.Join(root, "bin/busybox")).CombinedOutput(); err != nil {
		t.Fatalf("cp busybox: %v %s", err, out)
	}
	list, err := exec.Command(bb, "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, applet := range strings.Fields(string(list)) {
		if applet != "busybox" {
			if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
				t.Fatal(err)
			}
		}
	}
	writeFiles(t, root, map[string]string{
		"etc/os-release": "PRETTY_NAME=\"busybox root\"\nID=busybox\n",
		"etc/passwd":     "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":      "root:x:0:\n",
	})
	tarball := filepath.Join(t.TempDir(), "rootfs.tar")
	if out, err := exec.Command("tar", "-C", root, "--numeric-owner", "-cf", tarball, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v %s", err, out)
	}
	return tarball
}

// TestGateway_ImportedImage imports a busybox root with the real vmgated,
// and runs commands, file transfers and a networked fetch in it: the
// agent is its init, and configures the NIC itself.
func TestGateway_ImportedImage(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresImage(t)
	bin := os.Getenv("VMGATE_TEST_BIN")
	if bin == "" {
		t.Skip("VMGATE_TEST_BIN not set")
	}
	inet := testutil.RequiresInternet(t)
	ln := inet.Listen(t, 80)
	go func() {
		_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s\n", r.Host) }))
	}()
	state := filepath.Join(t.TempDir(), "state")
	tarball := busyboxRoot(t)
	vmgated := filepath.Join(bin, "vmgated")
	if out, err := exec.Command(vmgated, "image", "import", "--state-dir", state, "--name", "bb", tarball).CombinedOutput(); err != nil {
		t.Fatalf("image import: %v\n%s", err, out)
	}
	out, err := exec.Command(vmgated, "image", "list", "--state-dir", state, "--image", filepath.Join(state, "image"), "--json").Output()
	if err != nil {
		t.Fatalf("image list: %v", err)
	}
	var images []struct{ Name, Suite string }
	if err := json.Unmarshal(out, &images); err != nil {
		t.Fatalf("image list: %v\n%s", err, out)
	}
	if !strings.Contains(fmt.Sprint(images), "{bb import}") {
		t.Fatalf("image list: %s", out)
	}
	// Importing the same tarball again keeps the image.
	if out, err := exec.Command(vmgated, "image", "import", "--state-dir", state, "--name", "bb", tarball).CombinedOutput(); err != nil || !strings.Contains(string(out), "up to date") {
		t.Fatalf("second import: %v %s", err, out)
	}

	pol := strings.Replace(testPolicy, `user = "root"`, `user = "agent"`+"\nimage = \"bb\"", 1)
	pol = strings.Replace(pol, "[profile.sessions]", "[profile.network]\nmode = \"allowlist\"\nallow = [\"allowed.test:80\"]\n[profile.sessions]", 1)
	d := gatewaytest.Start(t, pol, func(c *gateway.Config) {
		c.VM.StateDir = state
		c.NetHosts = map[string][]netip.Addr{"allowed.test": {inet.Addr}}
	})
	work := t.TempDir()
	writeFiles(t, work, map[string]string{"in/data.txt": "one\ntwo\n"})
	so, se, code := vmExec(t, d.Socket, work, "--put", "in:/tmp/", "--get", "/tmp/in:./back", "-c",
		"cat /etc/os-release | head -1; id -un; ip route | grep -o 'default via [0-9.]*'; wget -q -O- http://allowed.test/; wc -l < /tmp/in/data.txt; echo 3 >> /tmp/in/data.txt")
	want := "PRETTY_NAME=\"busybox root\"\nagent\ndefault via 10.0.2.2\nhello from allowed.test\n2\n"
	if code != 0 || so != want {
		t.Fatalf("exit %d\nstdout %q\nwant   %q\nstderr %s", code, so, want, se)
	}
	if b := testutil.ReadFile(t, filepath.Join(work, "back/data.txt")); b != "one\ntwo\n3\n" {
		t.Errorf("back/data.txt: %q", b)
	}
	d.StopAndCheck(t)
	if log := testutil.ReadFile(t, d.AuditPath); !strings.Contains(log, `"image":"bb"`) {
		t.Error("the audit log does not name the imported image")
	}
}

// TestGateway_ImportedOCIImage imports a BusyBox root with a second
// layer that deletes, replaces and adds files, as an OCI image layout,
// and runs a command in it: the layers' result is the guest's root, and
// the set-user-ID bit of its file is cleared. The image is one of the
// profile's images, pinned to its digest, beside the daemon's: a session
// started in it (vm-exec --image) keeps it, a command without --image
// runs in the profile's image, and an image not listed is refused.
func TestGateway_ImportedOCIImage(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresImage(t)
	bin := os.Getenv("VMGATE_TEST_BIN")
	if bin == "" {
		t.Skip("VMGATE_TEST_BIN not set")
	}
	base, err := tarball.LayerFromFile(busyboxRoot(t), tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	var top bytes.Buffer
	tw := tar.NewWriter(&top)
	for _, e := range []struct {
		name, body string
		mode       int64
	}{
		{"etc/.wh.os-release", "", 0o644},
		{"etc/motd", "from layer 2\n", 0o644},
		{"bin/suid", "#!/bin/sh\n", 0o4755},
		{"srv/", "", 0o755},
	} {
		typ := byte(tar.TypeReg)
		if strings.HasSuffix(e.name, "/") {
			typ = tar.TypeDir
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(e.body)), Typeflag: typ}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer2, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(top.Bytes())), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON), base, layer2)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	// Its configuration's Env, WorkingDir and User are the defaults of
	// its commands (the user as the policy allows it).
	cfg.Config.Env = []string{"IMAGE_GREETING=hello from the image", "GREETING=the image's"}
	cfg.Config.WorkingDir = "/srv"
	cfg.Config.User = "root:root"
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}

	state := filepath.Join(t.TempDir(), "state")
	vmgated := filepath.Join(bin, "vmgated")
	if out, err := exec.Command(vmgated, "image", "import", "--state-dir", state, "--name", "oci", dir).CombinedOutput(); err != nil {
		t.Fatalf("image import: %v\n%s", err, out)
	}
	out, err := exec.Command(vmgated, "image", "list", "--state-dir", state, "--image", filepath.Join(state, "image"), "--json").Output()
	if err != nil || !strings.Contains(string(out), `"manifest_digest": "`+digest.String()+`"`) || !strings.Contains(string(out), `"platform": "linux/amd64"`) {
		t.Fatalf("image list: %v\n%s", err, out)
	}
	// The profile's image is the daemon's; the imported one is another of
	// its images, pinned to its manifest digest (checked at start).
	pol := strings.Replace(testPolicy, `user = "root"`, `user = "agent"`+"\nusers = [\"agent\", \"root\"]\nimages = [\"default\", \"oci@"+digest.String()+"\"]", 1)
	// An SSH login's profile runs the imported image, which has no bash.
	pol += `
[[profile]]
name = "ssh"
match = { ssh = true }
allow_shell = true
image = "oci"
sessions = { allowed = true, idle_timeout = "5m", max_lifetime = "10m" }
`
	keyDir := t.TempDir()
	sshKey, sshPub := sshClientKey(t, keyDir, "key")
	keysFile := filepath.Join(keyDir, "authorized_keys")
	if err := os.WriteFile(keysFile, []byte(authorizedLine(`profile="ssh"`, sshPub, "ssh@integ")), 0o600); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := gatewaytest.Start(t, pol, func(c *gateway.Config) {
		c.VM.StateDir = state
		c.SSH = &sshfront.Config{Listeners: []net.Listener{ln}, AuthorizedKeys: keysFile}
	})
	work := t.TempDir()
	// A session started in the imported image runs there, and keeps it;
	// its commands start in the image's WorkingDir with its Env, under
	// what the caller passes, as its User (one of the profile's users).
	so, se, code := vmExec(t, d.Socket, work, "--session", "s", "--image", "oci", "--receipt", "r.json", "-e", "GREETING=mine", "-c",
		"cat /etc/motd; test -e /etc/os-release || echo os-release gone; stat -c %a /bin/suid; id -un; pwd; echo $IMAGE_GREETING; echo $GREETING")
	if want := "from layer 2\nos-release gone\n755\nroot\n/srv\nhello from the image\nmine\n"; code != 0 || so != want {
		t.Fatalf("exit %d\nstdout %q\nwant   %q\nstderr %s", code, so, want, se)
	}
	if r := testutil.ReadFile(t, filepath.Join(work, "r.json")); !strings.Contains(r, `"image":{"name":"oci",`) || !strings.Contains(r, `"manifest_digest":"`+digest.String()+`"`) {
		t.Errorf("the receipt does not name the image and its manifest digest:\n%s", r)
	}
	if so, se, code := vmExec(t, d.Socket, work, "--session", "s", "-w", "/tmp", "-u", "agent", "-c", "cat /etc/motd; pwd; echo $GREETING; id -un"); code != 0 || so != "from layer 2\n/tmp\nthe image's\nagent\n" {
		t.Errorf("the session's next command: exit %d, stdout %q, stderr %s", code, so, se)
	}
	if so, _, code := vmExec(t, d.Socket, work, "--list-sessions"); code != 0 || !strings.Contains(so, "image=oci") {
		t.Errorf("--list-sessions: exit %d, %q", code, so)
	}
	if _, se, code := vmExec(t, d.Socket, work, "--session", "s", "--image", "default", "true"); code != 201 || !strings.Contains(se, `session "s" runs in image "oci", not "default"`) {
		t.Errorf("another image in the session: exit %d, stderr %s", code, se)
	}
	// Without --image, the profile's image; an image not listed is refused.
	if so, se, code := vmExec(t, d.Socket, work, "-c", "test -e /bin/suid || echo no suid; . /etc/os-release; echo $ID; id -un"); code != 0 || so != "no suid\ndebian\nagent\n" {
		t.Errorf("the profile's image: exit %d, stdout %q, stderr %s", code, so, se)
	}
	if _, se, code := vmExec(t, d.Socket, work, "--image", "ruby", "true"); code != 201 || !strings.Contains(se, `images: image "ruby" is not one of the profile's images (default, oci)`) {
		t.Errorf("an image not listed: exit %d, stderr %s", code, se)
	}
	// An SSH login without a command gets the image's login shell: sh,
	// as the image has no bash.
	if out, code := sshLoginShell(t, ln.Addr().String(), sshKey, filepath.Join(state, sshfront.DefaultHostKey+".pub"),
		"readlink /proc/$$/exe; exit 3\n"); code != 3 || !strings.Contains(out, "/bin/busybox\r\n") {
		t.Errorf("SSH login shell: exit %d, output %q", code, out)
	}
	d.StopAndCheck(t)
	log := testutil.ReadFile(t, d.AuditPath)
	// Each decision names the image it was made for: the one decided on,
	// or for a denial the one asked for.
	images := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var rec struct{ Kind, Verdict, Image string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Kind == "decision" {
			images[rec.Verdict+" "+rec.Image]++
		}
	}
	if want := map[string]int{"allow oci": 3, "allow default": 2, "deny ruby": 1}; !maps.Equal(images, want) {
		t.Errorf("decisions by verdict and image: %v, want %v", images, want)
	}
	if !strings.Contains(log, `"argv":["sh","-l"]`) {
		t.Errorf("the audit log does not decide the SSH login as sh -l:\n%s", log)
	}
	if n := strings.Count(log, `"image":"oci","image_digest":`); n != 3 || !strings.Contains(log, `"image":"default"`) {
		t.Errorf("the audit log names the imported image %d times (want 3: the session's commands and the SSH login) or not the default image:\n%s", n, log)
	}
	if n := strings.Count(log, `"image_manifest_digest":"`+digest.String()+`"`); n != 3 {
		t.Errorf("the audit log names the imported image's manifest digest %d times, want 3", n)
	}
}

// sshLoginShell logs in to the SSH door at addr with the key in keyFile,
// checking the host key in hostKeyFile, asks for a terminal and a shell
// without a command, types input and returns what the terminal showed and
// the shell's exit status.
func sshLoginShell(t *testing.T, addr, keyFile, hostKeyFile, input string) (string, int) {
	t.Helper()
	conn := sshDial(t, addr, keyFile, []byte(testutil.ReadFile(t, hostKeyFile)))
	defer conn.Close()
	sess, err := conn.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestPty("xterm", 24, 80, ssh.TerminalModes{}); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sess.Stdout, sess.Stdin = &out, strings.NewReader(input)
	if err := sess.Shell(); err != nil {
		t.Fatal(err)
	}
	err = sess.Wait()
	var exit *ssh.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitStatus()
	}
	t.Fatalf("SSH shell: %v; output %q", err, out.String())
	return "", 0
}
