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
	"slices"
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
// a tarball such as docker export writes. Its applets are absolute links
// to /bin/busybox, as Alpine's are (/bin/sh among them).
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
			if err := os.Symlink("/bin/busybox", filepath.Join(root, "bin", applet)); err != nil {
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

// systemdRoot writes the root file system of the test image (vmgate's
// Debian build, whose /sbin/init is systemd) as a tarball, without what
// that build adds to start the agent and the network: the agent, its
// unit, and systemd-networkd's configuration and enablement. An import
// that keeps systemd must add its own for the root to serve.
func systemdRoot(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	raw := filepath.Join(dir, "root.raw")
	run := func(name string, args ...string) string {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		return string(out)
	}
	run("qemu-img", "convert", "-O", "raw", filepath.Join(os.Getenv("VMGATE_TEST_IMAGE"), "base.qcow2"), raw)
	// debugfs reads the file system without mounting it; rdump of "/"
	// itself is refused, so each entry of the root goes.
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	var top []string
	for _, line := range strings.Split(run("debugfs", "-R", "ls -p /", raw), "\n") {
		// /INODE/MODE/UID/GID/NAME/SIZE/
		if f := strings.Split(line, "/"); len(f) >= 7 && f[5] != "." && f[5] != ".." && f[5] != "lost+found" {
			top = append(top, "/"+f[5])
		}
	}
	if len(top) < 5 {
		t.Fatalf("the image's root lists %q", top)
	}
	run("debugfs", "-R", "rdump "+strings.Join(top, " ")+" "+root, raw)
	for _, p := range []string{"usr/local/sbin/vmgate-agent", "etc/systemd/system/vmgate-agent.service",
		"etc/systemd/system/sysinit.target.wants/vmgate-agent.service", "etc/systemd/network/80-vmgate.network",
		"etc/systemd/system/multi-user.target.wants/systemd-networkd.service", "etc/systemd/system/sockets.target.wants/systemd-networkd.socket"} {
		if err := os.Remove(filepath.Join(root, p)); err != nil {
			t.Fatalf("the test image does not have %s: %v", p, err)
		}
	}
	if target, err := os.Readlink(filepath.Join(root, "sbin/init")); err != nil || !strings.HasSuffix(target, "/systemd") {
		t.Fatalf("the test image's /sbin/init: %q, %v", target, err)
	}
	tarball := filepath.Join(dir, "rootfs.tar")
	run("tar", "-C", root, "--numeric-owner", "-cf", tarball, ".")
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	return tarball
}

// TestGateway_ImportedImage imports a busybox root with the real vmgated,
// and runs commands, file transfers and a networked fetch in it: the
// agent is its init, and configures the NIC itself. Beside it, a Debian
// root imported with --init image boots its own systemd, which starts the
// agent and the network from the units the import wrote.
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
	// A root whose own systemd stays its init (--init image); one whose
	// init is not systemd is refused, and no image is left of it.
	if out, err := exec.Command(vmgated, "image", "import", "--state-dir", state, "--name", "bbinit", "--init", "image", tarball).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "/sbin/init cannot be used") {
		t.Errorf("--init image of a root without systemd: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(state, "images", "bbinit")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused import left %v", err)
	}
	if out, err := exec.Command(vmgated, "image", "import", "--state-dir", state, "--name", "sysd", "--init", "image", systemdRoot(t)).CombinedOutput(); err != nil {
		t.Fatalf("image import --init image: %v\n%s", err, out)
	}
	if out, err := exec.Command(vmgated, "image", "list", "--state-dir", state, "--image", filepath.Join(state, "image"), "--json").Output(); err != nil ||
		!strings.Contains(string(out), `"init": "systemd"`) {
		t.Errorf("image list does not show the kept init: %v\n%s", err, out)
	}

	pol := strings.Replace(testPolicy, `user = "root"`, `user = "agent"`+"\nimage = \"bb\"\nimages = [\"bb\", \"sysd\"]", 1)
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
	// The root that kept systemd: systemd is PID 1, it started the agent
	// and the network from the import's units, and the network works.
	so, se, code = vmExec(t, d.Socket, work, "--image", "sysd", "-c",
		"cat /proc/1/comm; systemctl is-active vmgate-agent vmgate-network; ip route | grep -o 'default via [0-9.]*'; wget -q -O- http://allowed.test/; id -un")
	if want := "systemd\nactive\nactive\ndefault via 10.0.2.2\nhello from allowed.test\nagent\n"; code != 0 || so != want {
		t.Errorf("the image that kept systemd: exit %d\nstdout %q\nwant   %q\nstderr %s", code, so, want, se)
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
		link       string
	}{
		{"etc/.wh.os-release", "", 0o644, ""},
		{"etc/motd", "from layer 2\n", 0o644, ""},
		{"bin/suid", "#!/bin/sh\n", 0o4755, ""},
		{"srv/", "", 0o755, ""},
		// An entry through an absolute link lands where the guest finds
		// it (the link is the root's, not the host's).
		{"opt/", "", 0o755, ""},
		{"opt/app", "", 0o777, "/srv"},
		{"opt/app/marker", "through /opt/app\n", 0o644, ""},
	} {
		typ := byte(tar.TypeReg)
		switch {
		case e.link != "":
			typ = tar.TypeSymlink
		case strings.HasSuffix(e.name, "/"):
			typ = tar.TypeDir
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: e.mode, Size: int64(len(e.body)), Typeflag: typ, Linkname: e.link}); err != nil {
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
		"cat /etc/motd; test -e /etc/os-release || echo os-release gone; stat -c %a /bin/suid; id -un; pwd; echo $IMAGE_GREETING; echo $GREETING; cat marker")
	if want := "from layer 2\nos-release gone\n755\nroot\n/srv\nhello from the image\nmine\nthrough /opt/app\n"; code != 0 || so != want {
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
	// A caller learns the images it may name.
	if st, err := d.Client.Status(t.Context()); err != nil || st.Caller == nil || st.Caller.Image != "default" || !slices.Equal(st.Caller.Images, []string{"default", "oci"}) {
		t.Errorf("status: %v; caller %+v, want image default and images [default oci]", err, st.Caller)
	}
	// The image imported again, with another digest, while the daemon
	// runs: the pin refuses new VMs of it; the session that began with
	// the pinned image keeps running it, and its records say so.
	cfg.Config.Env = []string{"IMAGE_GREETING=another build"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		t.Fatal(err)
	}
	dir2 := filepath.Join(t.TempDir(), "layout")
	if p, err = layout.Write(dir2, empty.Index); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		t.Fatal(err)
	}
	digest2, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(vmgated, "image", "import", "--state-dir", state, "--name", "oci", dir2).CombinedOutput(); err != nil {
		t.Fatalf("image import again: %v\n%s", err, out)
	}
	if _, se, code := vmExec(t, d.Socket, work, "--image", "oci", "true"); code != 201 ||
		!strings.Contains(se, `image "oci": pinned to `+digest.String()+`, but the image's manifest digest is `+digest2.String()) {
		t.Errorf("a pinned image imported again: exit %d, stderr %s", code, se)
	}
	if so, se, code := vmExec(t, d.Socket, work, "--session", "s", "-c", "echo $IMAGE_GREETING"); code != 0 || so != "hello from the image\n" {
		t.Errorf("the session of the pinned image after the import: exit %d, stdout %q, stderr %s", code, so, se)
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
	if want := map[string]int{"allow oci": 4, "allow default": 2, "deny ruby": 1, "deny oci": 1}; !maps.Equal(images, want) {
		t.Errorf("decisions by verdict and image: %v, want %v", images, want)
	}
	if !strings.Contains(log, `"argv":["sh","-l"]`) {
		t.Errorf("the audit log does not decide the SSH login as sh -l:\n%s", log)
	}
	if n := strings.Count(log, `"image":"oci","image_digest":`); n != 4 || !strings.Contains(log, `"image":"default"`) {
		t.Errorf("the audit log names the imported image %d times (want 4: the session's commands and the SSH login) or not the default image:\n%s", n, log)
	}
	if n := strings.Count(log, `"image_manifest_digest":"`+digest.String()+`"`); n != 4 {
		t.Errorf("the audit log names the imported image's manifest digest %d times, want 4 (the session's commands after the import again among them)", n)
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
