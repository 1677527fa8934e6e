package gateway

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/image"
)

// namedImagePolicy has one profile, on image "alt".
const namedImagePolicy = `version = 1

[[profile]]
name = "alt"
match = { any = true }
image = "alt"
`

// relink points the symlink at link to target.
func relink(t *testing.T, target, link string) {
	t.Helper()
	tmp := link + ".new"
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// TestNew_ResolvesDirectories: a daemon given its state, template,
// image, named image and audit log directories through symlinks uses
// their real paths from the start (they are what its jails bind). A
// reload follows a flipped image link, for the default image and a named
// one, and nothing else: a flipped state or audit link moves neither the
// daemon's files nor its audit chain until a restart. A link that leads
// nowhere stops the start with the link, its target and the fix.
func TestNew_ResolvesDirectories(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	disk, links := filepath.Join(root, "disk"), filepath.Join(root, "links")
	for _, d := range []string{"disk/state/images", "disk/state2", "disk/tmpl", "disk/audit", "disk/audit2", "links"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	img, img2, alt, alt2 := unbootableImage(t), unbootableImage(t), unbootableImage(t), unbootableImage(t)
	for target, link := range map[string]string{disk + "/state": "state", disk + "/tmpl": "tmpl", disk + "/audit": "audit", img: "image",
		alt: filepath.Join(disk, "state", "images", "alt")} {
		if !filepath.IsAbs(link) {
			link = filepath.Join(links, link)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
	}
	pol := filepath.Join(root, "policy.toml")
	if err := os.WriteFile(pol, []byte(namedImagePolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Socket: filepath.Join(root, "s.sock"), PolicyPath: pol, PolicyExplicit: true, AllowRoot: true,
		VM:        vm.HostConfig{Runtime: vm.Runtime{StateDir: links + "/state", TemplateDir: links + "/tmpl"}, ImageDir: links + "/image", NoTemplate: true, Cgroups: "off"},
		AuditPath: links + "/audit/audit.jsonl", Log: slog.New(slog.DiscardHandler)}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := map[string]string{"state": disk + "/state", "templates": disk + "/tmpl", "image": img, "images": disk + "/state/images", "audit log": disk + "/audit/audit.jsonl"}
	got := map[string]string{"state": s.cfg.VM.StateDir, "templates": s.cfg.VM.TemplateDir, "image": s.cfg.VM.ImageDir, "images": s.cfg.VM.ImagesDir, "audit log": s.cfg.AuditPath}
	for k := range want {
		if got[k] != want[k] {
			t.Errorf("%s: the daemon uses %s, want %s", k, got[k], want[k])
		}
	}
	imageDirs := func(step, wantDefault, wantAlt string) {
		t.Helper()
		d, _ := s.host.ImageDir(vm.DefaultImage)
		a, _ := s.host.ImageDir("alt")
		if d != wantDefault || a != wantAlt {
			t.Errorf("%s: images in %s and %s, want %s and %s", step, d, a, wantDefault, wantAlt)
		}
	}
	imageDirs("at start", img, alt)

	// Flipped links: the images', the state's and the audit log's.
	relink(t, img2, links+"/image")
	relink(t, alt2, disk+"/state/images/alt")
	relink(t, disk+"/state2", links+"/state")
	relink(t, disk+"/audit2", links+"/audit")
	s.Reload()
	if e := s.reloadErr.Load(); e != nil {
		t.Fatalf("reload: %v", *e)
	}
	imageDirs("after the reload", img2, alt2)
	if s.cfg.VM.StateDir != disk+"/state" || s.cfg.AuditPath != disk+"/audit/audit.jsonl" {
		t.Errorf("after the reload: state %s, audit log %s", s.cfg.VM.StateDir, s.cfg.AuditPath)
	}
	if log := testutil.ReadFile(t, disk+"/audit/audit.jsonl"); !strings.Contains(log, "policy reloaded") {
		t.Errorf("the audit chain did not go on in its file:\n%s", log)
	}
	if _, err := os.Stat(disk + "/audit2/audit.jsonl"); err == nil {
		t.Error("the reload started an audit log behind the flipped link")
	}

	// A reload onto a link that leads nowhere keeps the images, and says
	// why.
	relink(t, root+"/img-2026-12", links+"/image")
	s.Reload()
	e := s.reloadErr.Load()
	if e == nil || !strings.Contains((*e).Error(), links+"/image is a symlink to "+root+"/img-2026-12, which does not exist") {
		t.Fatalf("reload onto a dangling image link: %v", e)
	}
	imageDirs("after the refused reload", img2, alt2)
	s.Close()

	// At start, the same link is an error naming it.
	cfg.VM.StateDir = disk + "/state"
	_, err = New(cfg)
	if err == nil || !strings.Contains(err.Error(), links+"/image is a symlink to "+root+"/img-2026-12, which does not exist: point the link at an existing directory") {
		t.Fatalf("start with a dangling image link: %v", err)
	}
}

// TestNew_ImagePins: every image of a profile's images must be there, and
// one pinned to a manifest digest must have that digest, at start and at
// each reload; a refused reload keeps the policy in force.
func TestNew_ImagePins(t *testing.T) {
	root, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(root, "state")
	if err := os.MkdirAll(filepath.Join(state, "images"), 0o700); err != nil {
		t.Fatal(err)
	}
	digest := "sha256:" + strings.Repeat("a1", 32)
	other := "sha256:" + strings.Repeat("b2", 32)
	py := unbootableImage(t)
	m, err := image.ReadManifest(py)
	if err != nil {
		t.Fatal(err)
	}
	m.Source = &image.Source{Kind: image.SourceLayout, Reference: "/py-layout", ManifestDigest: digest}
	if err := image.WriteManifest(py, m); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"py": py, "built": unbootableImage(t)} {
		if err := os.Symlink(dir, filepath.Join(state, "images", name)); err != nil {
			t.Fatal(err)
		}
	}
	pol := filepath.Join(root, "policy.toml")
	write := func(images string) {
		t.Helper()
		text := "version = 1\n[[profile]]\nname = \"p\"\nmatch = { any = true }\nimages = [" + images + "]\n"
		if err := os.WriteFile(pol, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := Config{Socket: filepath.Join(root, "s.sock"), PolicyPath: pol, PolicyExplicit: true, AllowRoot: true,
		VM:        vm.HostConfig{Runtime: vm.Runtime{StateDir: state}, ImageDir: unbootableImage(t), NoTemplate: true, Cgroups: "off"},
		AuditPath: filepath.Join(root, "audit", "audit.jsonl"), Log: slog.New(slog.DiscardHandler)}

	write(`"py@` + other + `", "default"`)
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), `profile "p": image "py": pinned to `+other+`, but the image's manifest digest is `+digest) {
		t.Fatalf("start with a pin the image does not match: %v", err)
	}
	write(`"default", "py@` + digest + `", "built"`)
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("start with a pin the image matches: %v", err)
	}
	defer s.Close()
	for _, c := range []struct{ images, want string }{
		{`"default", "py@` + other + `"`, `image "py": pinned to ` + other + `, but the image's manifest digest is ` + digest},
		{`"default", "built@` + digest + `"`, `image "built": pinned to ` + digest + `, but the image has no manifest digest`},
		{`"default", "gone"`, `image "gone": `},
	} {
		write(c.images)
		s.Reload()
		if e := s.reloadErr.Load(); e == nil || !strings.Contains((*e).Error(), c.want) {
			t.Errorf("reload with images [%s]: %v, want %q", c.images, e, c.want)
		}
		if imgs := s.policyNow().Images(); len(imgs) != 3 || imgs[1].Digest != digest {
			t.Errorf("reload with images [%s]: the policy in force is %+v, want the one before", c.images, imgs)
		}
	}
}
