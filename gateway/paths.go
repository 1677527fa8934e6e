package gateway

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/vmgate/vmgate/policy"
	"github.com/vmgate/vmgate/vm"
)

// Directories. QEMU's jail binds each file at its real path, so a
// directory reached through a symlink (/var/lib on a data disk, an
// image -> image-2026-12 link) would name nothing inside it (vm/paths.go).
// New therefore resolves every directory the daemon is given once
// (resolveDirs): the state directory, its templates, the default image,
// the images directory and the audit log's directory; it logs them and
// uses only those from then on, so the daemon and its jails agree, and a
// link changed while it runs moves nothing under it.
//
// Images are resolved again at each reload, on purpose: the default image
// (--image) and every image the policy names (checkImages), so that
// flipping a link and sending SIGHUP moves new VMs to the new image
// (vm.Host.UseImages), while running VMs and sessions keep the files they
// started with. The state, template and audit directories are not: the
// running VMs, the daemon's lock and the audit chain live there, and a
// change takes a restart.

// imageLinks are the image directories as configured, resolved again at
// each reload: the default image, and the directory of named images.
type imageLinks struct{ image, images string }

// resolveDirs resolves cfg's directories in place (creating the state,
// template and audit log directories when missing) and logs them. It
// returns the image directories as configured.
func resolveDirs(cfg *Config, log *slog.Logger) (imageLinks, error) {
	given := *cfg
	state, err := openStateDir(cfg.VM.StateDir, log)
	if err != nil {
		return imageLinks{}, err
	}
	links := imageLinks{image: cfg.VM.ImageDir, images: cfg.VM.ImagesDir}
	if links.image == "" {
		links.image = filepath.Join(state, "image")
	}
	if links.images == "" {
		links.images = filepath.Join(state, "images")
	}
	cfg.VM.StateDir, cfg.VM.ImageDir, cfg.VM.ImagesDir = state, links.image, links.images
	if err := cfg.VM.ResolveDirs(); err != nil {
		return imageLinks{}, err
	}
	audit, err := vm.ResolveNewDir(filepath.Dir(cfg.AuditPath), 0o750)
	if err != nil {
		return imageLinks{}, fmt.Errorf("audit log directory: %w", err)
	}
	cfg.AuditPath = filepath.Join(audit, filepath.Base(cfg.AuditPath))
	log.Info("directories", "state", cfg.VM.StateDir, "templates", cfg.VM.TemplateDir, "image", cfg.VM.ImageDir,
		"images", cfg.VM.ImagesDir, "audit_log", cfg.AuditPath)
	for _, d := range []struct{ what, given, used string }{
		{"state directory", given.VM.StateDir, cfg.VM.StateDir}, {"template directory", given.VM.TemplateDir, cfg.VM.TemplateDir},
		{"image directory", given.VM.ImageDir, cfg.VM.ImageDir}, {"images directory", given.VM.ImagesDir, cfg.VM.ImagesDir},
		{"audit log", given.AuditPath, cfg.AuditPath},
	} {
		if abs, _ := filepath.Abs(d.given); d.given != "" && abs != d.used {
			log.Info(d.what+" reached through a symlink: using its target", "given", d.given, "using", d.used)
		}
	}
	return links, nil
}

// checkImages resolves the default image and every image policy p names
// as they are now (imageLinks), and checks each: the directories to use
// (vm.Host.UseImages), or an error naming each profile whose image cannot
// be used, and why: not built or not whole, or (pinned in the profile's
// images) with another manifest digest than the pin's.
func (s *Server) checkImages(p *policy.Policy) (map[string]string, error) {
	dirs := map[string]string{}
	seen := map[string]error{}
	check := func(name string) error {
		if err, ok := seen[name]; ok {
			return err
		}
		link := s.links.image
		if name != vm.DefaultImage {
			link = filepath.Join(s.links.images, name) // a valid name (policy) is no path
		}
		dir, err := vm.ResolveImageDir(link)
		if err == nil {
			err = vm.CheckImageDir(dir)
		}
		var de *vm.DirError
		switch {
		case err == nil:
			dirs[name] = dir
		case !errors.As(err, &de): // not built, or not whole; a path problem says its own fix
			err = fmt.Errorf("%w (build it: vmgated image build --name %s)", err, name)
		}
		seen[name] = err
		return err
	}
	var errs []error
	named := false
	for _, pi := range p.Images() {
		name := pi.Image
		if name == "" {
			name = vm.DefaultImage
		}
		named = named || name == vm.DefaultImage
		err := check(name)
		if err == nil && pi.Digest != "" {
			err = checkPin(dirs[name], pi.Digest)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("profile %q: image %q: %w", pi.Profile, name, err))
		}
	}
	if err := check(vm.DefaultImage); err != nil && !named {
		errs = append(errs, fmt.Errorf("image %q (vmgated serve --image): %w", vm.DefaultImage, err))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("policy %s: %w", p.Source(), errors.Join(errs...))
	}
	return dirs, nil
}

// useImages resolves and checks the images as checkImages does, and moves
// the host's to the directories found (vm.Host.UseImages), logging each
// image whose directory changed.
func (s *Server) useImages(p *policy.Policy) error {
	dirs, err := s.checkImages(p)
	if err != nil {
		return err
	}
	moves, err := s.host.UseImages(dirs)
	if err != nil {
		return err
	}
	for _, mv := range moves {
		s.log.Info("image directory: its new VMs start from here, running ones keep theirs", "image", mv.Name, "dir", mv.To, "was", mv.From)
	}
	return nil
}

// checkPin checks the image in dir (checked whole) against the manifest
// digest pin that a profile's images pins it to (policy.CheckPin).
func checkPin(dir, pin string) error {
	digest, err := vm.ImageManifestDigest(dir)
	if err != nil {
		return err
	}
	return policy.CheckPin(pin, digest)
}
