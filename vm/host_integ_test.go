package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm/image"
)

// TestHost_GetEachWay builds a Host as the daemon does and takes VMs of
// one shape from it: restored (from the pool or now) with templates on,
// booted cold with them off. Each VM runs a command; the Host cleans up
// what a crashed daemon left, reports its shapes and leaves no VM behind.
func TestHost_GetEachWay(t *testing.T) {
	img := testutil.RequiresImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	shape := Shape{MemoryMiB: DefaultMemoryMiB, CPUs: DefaultCPUs}
	cfg := HostConfig{Runtime: Runtime{TemplateDir: testutil.TemplateDir(t), Accel: AccelAuto}, ImageDir: img, Cgroups: "off", PoolSize: 1}

	// The shape's template exists before the Host starts, so that every
	// Get of the templated Host restores (none boots while it builds).
	cfg.StateDir = t.TempDir()
	pre := &Host{cfg: cfg}
	tmpl, err := EnsureTemplate(ctx, pre.options(shape))
	if err != nil {
		t.Fatal(err)
	}
	_ = tmpl.Close()

	for _, tc := range []struct {
		name       string
		noTemplate bool
		want       map[string]bool
	}{
		{"templates", false, map[string]bool{FromPool: true, FromRestore: true}},
		{"cold", true, map[string]bool{FromBoot: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := cfg
			cfg.StateDir, cfg.NoTemplate = t.TempDir(), tc.noTemplate
			stale := filepath.Join(cfg.StateDir, "vms", "0123456789ab")
			if err := os.MkdirAll(stale, 0o700); err != nil {
				t.Fatal(err)
			}
			h, err := NewHost(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a crashed daemon's VM directory is left: %v", err)
			}
			m, _ := image.ReadManifest(img)
			if h.ImageDigest() != m.Artifacts[image.BaseFile].SHA256 {
				t.Errorf("image digest %q", h.ImageDigest())
			}
			const runs = 2
			for i := range runs {
				v, how, err := h.Get(ctx, shape)
				if err != nil {
					t.Fatalf("get %d: %v", i, err)
				}
				if !tc.want[how] {
					t.Errorf("get %d came from %q, want one of %v", i, how, tc.want)
				}
				var out bytes.Buffer
				res, err := v.Exec(ctx, ExecRequest{Argv: []string{"echo", "hi"}, Stdout: &out, Timeout: time.Minute})
				if err != nil || res.ExitCode != 0 || out.String() != "hi\n" {
					t.Errorf("exec in VM %d (%s): %v %+v %q", i, how, err, res, out.String())
				}
				if err := v.Close(); err != nil {
					t.Errorf("close VM %d: %v", i, err)
				}
			}
			st := h.Stats()
			switch {
			case tc.noTemplate && len(st) != 0:
				t.Errorf("stats with templates off: %+v", st)
			case !tc.noTemplate && (len(st) != 1 || st[0].Shape != shape.normal() || st[0].Pool.Hits+st[0].Pool.Misses != runs):
				t.Errorf("stats: %+v", st)
			}
			if err := h.Close(); err != nil {
				t.Fatal(err)
			}
			if ents, _ := os.ReadDir(filepath.Join(cfg.StateDir, "vms")); len(ents) != 0 {
				t.Errorf("VM directories left after Close: %v", ents)
			}
		})
	}
}

// TestHost_RefusesBadImage: a Host is not built on an image that does not
// verify, and says why.
func TestHost_RefusesBadImage(t *testing.T) {
	dir := t.TempDir()
	_, err := NewHost(HostConfig{Runtime: Runtime{StateDir: t.TempDir()}, ImageDir: dir, Cgroups: "off"})
	if !errors.Is(err, image.ErrNotBuilt) {
		t.Fatalf("empty image dir: %v, want ErrNotBuilt", err)
	}
}
