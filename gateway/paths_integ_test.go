package gateway_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmgate/vmgate/gateway"
	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/gateway/wire"
	"github.com/vmgate/vmgate/internal/testutil"
)

// symlinkTo makes link a symlink to target.
func symlinkTo(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// TestGateway_DirectoriesThroughSymlinks: a daemon whose state, image,
// template and audit directories are each reached through a symlink (a
// data disk, an image -> image-2026-12 link) runs VMs: restored from the
// template in the linked directory, on the linked image, in the linked
// state directory, audited in the linked directory. Before, every VM
// failed: QEMU was given the links' paths, and its jail binds files at
// their real paths only.
//
// The same daemon holds a put whose client stops sending: the request
// ends at its time limit, with the reason, and frees its VM (finding 7).
func TestGateway_DirectoriesThroughSymlinks(t *testing.T) {
	img := testutil.RequiresImage(t)
	real, links := t.TempDir(), t.TempDir()
	for _, d := range []string{"state", "audit"} {
		if err := os.Mkdir(filepath.Join(real, d), 0o700); err != nil {
			t.Fatal(err)
		}
		symlinkTo(t, filepath.Join(real, d), filepath.Join(links, d))
	}
	symlinkTo(t, img, filepath.Join(links, "image"))
	symlinkTo(t, testutil.TemplateDir(t), filepath.Join(links, "templates"))
	d := gatewaytest.Start(t, testPolicy, func(c *gateway.Config) {
		c.VM.StateDir, c.VM.ImageDir, c.VM.TemplateDir = filepath.Join(links, "state"), filepath.Join(links, "image"), filepath.Join(links, "templates")
		c.AuditPath = filepath.Join(links, "audit", "audit.jsonl")
		c.VM.NoTemplate, c.VM.PoolSize = false, 1
		// One VM at a time: the request after the stalled put gets one
		// only once that put's VM is freed.
		c.MaxVMs = 1
	})
	ctx := context.Background()
	if err := d.WaitPool(ctx, 1); err != nil {
		t.Fatal(err)
	}
	res, so, se := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo", "through the links"}}, nil)
	if res.ExitCode != 0 || so != "through the links\n" || res.VMStart != "pool" {
		t.Fatalf("exec: exit %d, vm start %q, stdout %q, stderr %q", res.ExitCode, res.VMStart, so, se)
	}
	if log := testutil.ReadFile(t, filepath.Join(real, "audit", "audit.jsonl")); !strings.Contains(log, "through the links") {
		t.Errorf("the audit log in the linked directory lacks the command:\n%s", log)
	}

	t.Run("stalled put", func(t *testing.T) {
		// A put whose client sends the start of a tree, then nothing,
		// and stays connected; the command's time limit is 3 s.
		const limit = 3 * time.Second
		var stream bytes.Buffer
		tw := tar.NewWriter(&stream)
		if err := tw.WriteHeader(&tar.Header{Name: "t/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
		stalled, unblock := io.Pipe()
		defer unblock.Close()
		go func() { _, _ = unblock.Write(stream.Bytes()) }()
		req := wire.ExecRequest{Argv: []string{"true"}, TimeoutMS: limit.Milliseconds(), Put: []wire.PutSpec{{Guest: "/tmp/", Top: "t", Files: 2, Bytes: 10}}}
		done := make(chan error, 1)
		t0 := time.Now()
		go func() {
			_, err := d.Client.Exec(ctx, req, client.ExecIO{Puts: []io.Reader{stalled}})
			done <- err
		}()
		// The margin covers a loaded host's restore and the guest's kill,
		// and stays under the stall time (60 s), which would end the put
		// too.
		const margin = 30 * time.Second
		select {
		case err := <-done:
			var fe *client.ExecFailedError
			if !errors.As(err, &fe) || fe.Body.Code != wire.KindTransfer.Code || !strings.Contains(fe.Body.Error, "timed out") {
				t.Errorf("the stalled put: %v, want its transfer error: timed out", err)
			}
			t.Logf("the stalled put ended after %v", time.Since(t0).Round(time.Millisecond))
		case <-time.After(limit + margin):
			t.Fatalf("a put whose client stopped sending had not ended %v after its time limit", margin)
		}
		// Its VM is freed: the one VM the daemon may run serves the next
		// request (which would otherwise be refused as busy after the
		// queue's wait).
		if res, so, _ := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo", "next"}}, nil); res.ExitCode != 0 || so != "next\n" {
			t.Fatalf("the next request: exit %d, %q", res.ExitCode, so)
		}
	})
	d.StopAndCheck(t)
	if ents, _ := os.ReadDir(filepath.Join(real, "state", "vms")); len(ents) != 0 {
		t.Errorf("VM directories left in the linked state directory: %v", ents)
	}
}

// TestGateway_ImageLinkFlip: the image directory is a link flipped to a
// new image while the daemon runs (image -> image-2026-12). The next
// reload moves new VMs to the new target, even once the old one is gone,
// and a session's VM started before keeps the files it started with.
func TestGateway_ImageLinkFlip(t *testing.T) {
	img := testutil.RequiresImage(t)
	dir := t.TempDir()
	old, cur, link := filepath.Join(dir, "image-old"), filepath.Join(dir, "image-new"), filepath.Join(dir, "image")
	for _, d := range []string{old, cur} {
		// Copies of the test image (hard links): two directories.
		if out, err := exec.Command("cp", "-al", img, d).CombinedOutput(); err != nil {
			t.Fatalf("cp: %v %s", err, out)
		}
	}
	symlinkTo(t, old, link)
	d := startDaemon(t, func(c *gateway.Config) { c.VM.ImageDir = link })
	sess := wire.ExecRequest{Argv: []string{"sh", "-c", "echo $((n + 1)) > /tmp/n; cat /tmp/n"}, Session: "kept"}
	if _, so, _ := d.MustExec(t, sess, nil); so != "1\n" {
		t.Fatalf("the session's first command: %q", so)
	}

	symlinkTo(t, cur, link+".new")
	if err := os.Rename(link+".new", link); err != nil {
		t.Fatal(err)
	}
	d.Reload()
	if st, err := d.Client.Status(context.Background()); err != nil || st.PolicyError != "" {
		t.Fatalf("reload after the flip: %v %+v", err, st)
	}
	// The old image is gone, as after an upgrade: new VMs can only come
	// from the new target.
	if err := os.RemoveAll(old); err != nil {
		t.Fatal(err)
	}
	if res, so, se := d.MustExec(t, wire.ExecRequest{Argv: []string{"echo", "from the new image"}}, nil); res.ExitCode != 0 || so != "from the new image\n" {
		t.Fatalf("a new VM after the flip: exit %d, %q %q", res.ExitCode, so, se)
	}
	// Its disk is still read: files its first command did not touch.
	sess.Argv = []string{"sh", "-c", "n=$(cat /tmp/n); echo $((n + 1)) > /tmp/n; cat /tmp/n; cat /usr/lib/os-release /usr/bin/python3* > /dev/null"}
	if res, so, se := d.MustExec(t, sess, nil); res.ExitCode != 0 || so != "2\n" {
		t.Fatalf("the session's VM after its image moved away: exit %d, %q %q", res.ExitCode, so, se)
	}
	d.StopAndCheck(t)
}
