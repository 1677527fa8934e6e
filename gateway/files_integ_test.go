package gateway_test

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

// filesPolicy is testPolicy with small transfer limits, so that the
// refusals are cheap to reach.
var filesPolicy = strings.Replace(testPolicy, "[profile.sessions]", `[profile.files]
put_max_bytes = "64KiB"
get_max_files = 50
[profile.sessions]`, 1)

// vmExec runs the built vm-exec in dir against socket.
func vmExec(t *testing.T, socket, dir string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(testutil.Binary(t, "vm-exec"), append([]string{"--socket", socket}, args...)...)
	cmd.Dir = dir
	return testutil.Run(t, cmd)
}

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestGateway_Files copies files in and out through vm-exec --put/--get
// and cp, for a fresh VM and a session, and checks the refusals: a
// missing path, an upload over the policy's cap, and a hostile guest.
func TestGateway_Files(t *testing.T) {
	// Restored VMs (the shared test templates): it boots many.
	d := gatewaytest.Start(t, filesPolicy, func(c *gateway.Config) {
		c.VM.NoTemplate, c.VM.PoolSize, c.VM.TemplateDir = false, 1, testutil.TemplateDir(t)
	})
	work := t.TempDir()
	writeFiles(t, work, map[string]string{"proj/main.py": "print('hi')\n", "proj/lib/util.py": "X = 1\n", "notes.txt": "remember\n"})

	t.Run("put and get around a command", func(t *testing.T) {
		so, se, code := vmExec(t, d.Socket, work, "--put", "proj:/work/", "--put", "notes.txt:/work/n.txt", "--get", "/work/out:./result",
			"-c", "cd /work/proj && find . -type f | sort && cat /work/n.txt && mkdir /work/out && echo data > /work/out/x && python3 main.py > /work/out/ran")
		if code != 0 || so != "./lib/util.py\n./main.py\nremember\n" {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, so, se)
		}
		if b := testutil.ReadFile(t, filepath.Join(work, "result/x")); b != "data\n" {
			t.Errorf("result/x: %q", b)
		}
		if b := testutil.ReadFile(t, filepath.Join(work, "result/ran")); b != "hi\n" {
			t.Errorf("result/ran: %q", b)
		}
	})
	t.Run("get of a missing path", func(t *testing.T) {
		so, se, code := vmExec(t, d.Socket, work, "--get", "/nope:./x", "echo", "its own output")
		if code != wire.ExitTransfer || so != "its own output\n" || !strings.Contains(se, "get /nope: no such file or directory") {
			t.Fatalf("exit %d, stdout %q, stderr %q", code, so, se)
		}
		if _, err := os.Lstat(filepath.Join(work, "x")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a failed get left %s: %v", "x", err)
		}
		// A failed command keeps its exit code.
		if _, _, code := vmExec(t, d.Socket, work, "--get", "/nope:./x", "sh", "-c", "exit 3"); code != 3 {
			t.Errorf("exit %d after a failing command, want 3", code)
		}
	})
	t.Run("upload over the cap", func(t *testing.T) {
		writeFiles(t, work, map[string]string{"big/blob": strings.Repeat("x", 65<<10)})
		_, se, code := vmExec(t, d.Socket, work, "--put", "big:/tmp/", "true")
		if code != wire.ExitDenied || !strings.Contains(se, "files.put_max_bytes = 64 KiB") {
			t.Fatalf("exit %d, stderr %q", code, se)
		}
	})
	t.Run("cp in a session", func(t *testing.T) {
		if _, se, code := vmExec(t, d.Socket, work, "--session", "s", "cp", "notes.txt", ":/tmp/"); code != 0 {
			t.Fatalf("cp in: exit %d: %s", code, se)
		}
		if so, se, code := vmExec(t, d.Socket, work, "--session", "s", "cat", "/tmp/notes.txt"); code != 0 || so != "remember\n" {
			t.Fatalf("cat: exit %d, %q %q", code, so, se)
		}
		if _, se, code := vmExec(t, d.Socket, work, "cp", "s:/tmp/notes.txt", "back.txt"); code != 0 {
			t.Fatalf("cp out: exit %d: %s", code, se)
		}
		if b := testutil.ReadFile(t, filepath.Join(work, "back.txt")); b != "remember\n" {
			t.Errorf("back.txt: %q", b)
		}
		// The guest's own cp still runs: no argument names the guest.
		if so, _, code := vmExec(t, d.Socket, work, "--session", "s", "cp", "-v", "/tmp/notes.txt"); code == 0 || so != "" {
			t.Errorf("guest cp with a missing operand: exit %d, %q", code, so)
		}
	})
	t.Run("hostile guest", func(t *testing.T) { hostileGets(t, d.Socket, work) })

	d.StopAndCheck(t)
	log := testutil.ReadFile(t, d.AuditPath)
	sum := sha256.Sum256([]byte("remember\n"))
	for _, want := range []string{`"direction":"put","guest":"/work/n.txt","local":"` + filepath.Join(work, "notes.txt"),
		`"file_sha256":"` + hex.EncodeToString(sum[:]), `"direction":"get","guest":"/nope"`, "no such file or directory"} {
		if !strings.Contains(log, want) {
			t.Errorf("audit log lacks %s", want)
		}
	}
}

// hostileGets makes the session's guest answer gets with crafted tar
// streams (its agent binary replaced by a script), and checks that each
// is refused with nothing written.
func hostileGets(t *testing.T, socket, work string) {
	evil := map[string][]*tar.Header{
		"traversal":  {{Name: "traversal", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "traversal/../../escaped", Typeflag: tar.TypeReg, Mode: 0o644}},
		"symlinkout": {{Name: "symlinkout", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "symlinkout/l", Typeflag: tar.TypeSymlink, Linkname: "../../../etc"}},
		"abslink":    {{Name: "abslink", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "abslink/l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}},
		"device":     {{Name: "device", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "device/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}},
		"bomb":       {{Name: "bomb", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40}},
		"manyfiles":  {{Name: "manyfiles", Typeflag: tar.TypeDir, Mode: 0o755}},
	}
	for i := range 60 {
		evil["manyfiles"] = append(evil["manyfiles"], &tar.Header{Name: "manyfiles/f" + strings.Repeat("x", i), Typeflag: tar.TypeReg, Mode: 0o644})
	}
	want := map[string]string{"traversal": "not a clean name", "symlinkout": "leads out of the transfer", "abslink": "absolute symlink",
		"device": "device files", "bomb": "over the transfer limit", "manyfiles": "more than 50 files"}
	stage := filepath.Join(t.TempDir(), "evil")
	for name, hs := range evil {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hs {
			if err := tw.WriteHeader(h); err != nil {
				t.Fatal(err)
			}
		}
		_ = tw.Close() // the bomb's content is missing: its stream ends there
		writeFiles(t, stage, map[string]string{name + ".tar": b.String()})
	}
	if _, se, code := vmExec(t, socket, work, "--session", "s", "cp", stage, ":/tmp/"); code != 0 {
		t.Fatalf("staging the crafted streams: exit %d: %s", code, se)
	}
	fake := `for a; do p=$a; done; exec cat "/tmp/evil/$(basename "$p").tar"`
	if _, se, code := vmExec(t, socket, work, "--session", "s", "sh", "-c",
		`mv /usr/local/sbin/vmgate-agent /tmp/real-agent && printf '#!/bin/sh\n%s\n' '`+fake+`' > /usr/local/sbin/vmgate-agent && chmod 755 /usr/local/sbin/vmgate-agent`); code != 0 {
		t.Fatalf("replacing the agent's binary: exit %d: %s", code, se)
	}
	out := filepath.Join(t.TempDir(), "target")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, reason := range want {
		_, se, code := vmExec(t, socket, out, "cp", "s:/x/"+name, "./")
		if code != wire.ExitTransfer || !strings.Contains(se, reason) {
			t.Errorf("%s: exit %d, stderr %q; want %d and %q", name, code, se, wire.ExitTransfer, reason)
		}
	}
	for _, d := range []string{out, filepath.Dir(out)} {
		ents, _ := os.ReadDir(d)
		if len(ents) != 1 && d != out || len(ents) != 0 && d == out {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("%s holds %v after refused gets", d, names)
		}
	}
}
