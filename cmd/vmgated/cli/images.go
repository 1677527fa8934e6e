package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"text/tabwriter"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/cmd/vmgated/imagebuild"
	"github.com/vmgate/vmgate/internal/names"

	"github.com/vmgate/vmgate/vm"
	"github.com/vmgate/vmgate/vm/image"
)

// imageInfo is one line of `vmgated image list`.
type imageInfo struct {
	Name      string   `json:"name"`
	Dir       string   `json:"dir"`
	Suite     string   `json:"suite,omitempty"`
	Kernel    string   `json:"kernel,omitempty"`
	Packages  []string `json:"packages,omitempty"` // installed by name (the base set and --packages)
	SizeBytes int64    `json:"size_bytes,omitempty"`
	// Source is where an imported or pulled image came from: its
	// reference, manifest digest and platform.
	Source *image.Source `json:"source,omitempty"`
	// Init is "systemd" for an imported root that keeps its own
	// (image import --init image).
	Init      string `json:"init,omitempty"`
	Templates int    `json:"templates"` // VM templates built from it
	Error     string `json:"error,omitempty"`
}

func imageList(fs *pflag.FlagSet) runFunc {
	state := fs.String("state-dir", defaultStateDir(), "state directory")
	imgDir := fs.String("image", "", "the default image's directory (default STATE/image)")
	templateDir := fs.String("template-dir", "", "VM template directory (default STATE/templates)")
	asJSON := fs.Bool("json", false, "print JSON")
	return func(ctx context.Context, args []string) error {
		if err := needStateDir(*state); err != nil {
			return err
		}
		if *imgDir == "" {
			*imgDir = defaultImageDir(*state)
		}
		if *templateDir == "" {
			*templateDir = filepath.Join(*state, "templates")
		}
		dirs := map[string]string{vm.DefaultImage: *imgDir}
		ents, err := os.ReadDir(filepath.Join(*state, "images"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		for _, e := range ents {
			if e.IsDir() && names.Image(e.Name()) && e.Name() != vm.DefaultImage {
				dirs[e.Name()] = filepath.Join(*state, "images", e.Name())
			}
		}
		digests := templateDigests(*templateDir)
		var out []imageInfo
		for name, dir := range dirs {
			out = append(out, describeImage(name, dir, digests))
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tSUITE\tKERNEL\tPACKAGES\tSIZE\tTEMPLATES\tREFERENCE\tDIGEST\tPLATFORM\tDIR")
		for _, i := range out {
			if i.Error != "" {
				fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\t%s (%s)\n", i.Name, i.Dir, i.Error)
				continue
			}
			ref, digest, platform := sourceColumns(i.Source)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d MiB\t%d\t%s\t%s\t%s\t%s\n", i.Name, i.Suite, i.Kernel, len(i.Packages), i.SizeBytes>>20, i.Templates,
				ref, digest, platform, i.Dir)
		}
		return tw.Flush()
	}
}

func describeImage(name, dir string, templates map[string]int) imageInfo {
	info := imageInfo{Name: name, Dir: dir}
	m, err := image.ReadManifest(dir)
	if err != nil {
		info.Error = "not built"
		return info
	}
	info.Suite, info.Kernel, info.Packages, info.Source, info.Init = m.Inputs.Suite, m.KernelVersion, m.Inputs.Packages, m.Source, m.Inputs.Init
	for _, a := range m.Artifacts {
		info.SizeBytes += a.Size
	}
	info.Templates = templates[m.Artifacts[image.BaseFile].SHA256]
	return info
}

// sourceColumns are image list's reference, digest and platform of an
// image from src ("-" for what it has not: a built image has none).
func sourceColumns(src *image.Source) (ref, digest, platform string) {
	ref, digest, platform = "-", "-", "-"
	if src == nil {
		return ref, digest, platform
	}
	if src.Reference != "" {
		ref = src.Reference
	}
	switch {
	case src.ManifestDigest != "":
		digest = src.ManifestDigest
	case src.ConfigDigest != "": // a docker save archive has no manifest
		digest = "id " + src.ConfigDigest
	}
	if src.Platform != "" {
		platform = src.Platform
	}
	return ref, digest, platform
}

// templateDigests counts the templates in dir by the image they were
// built from.
func templateDigests(dir string) map[string]int {
	out := map[string]int{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), vm.TemplateMetaFile))
		if err != nil {
			continue
		}
		var m vm.TemplateMeta
		if json.Unmarshal(b, &m) == nil {
			out[m.ImageDigest]++
		}
	}
	return out
}

// imageTarget is where an image goes: --out, or the state directory's
// place for --name (the default image without one).
func imageTarget(state, out, name string) (string, error) {
	if name != "" && !names.Image(name) {
		return "", fmt.Errorf("%w: --name %q: an image name is %s", errUsage, name, names.ImageRule)
	}
	if out != "" {
		if name != "" {
			return "", fmt.Errorf("%w: --name and --out both say where the image goes: give one", errUsage)
		}
		return out, nil
	}
	if err := needStateDir(state); err != nil {
		return "", fmt.Errorf("%w (or --out DIR)", err)
	}
	return namedImageDir(state, name), nil
}

// importFlags are the flags import and pull share.
type importFlags struct {
	state, out, name, agent, level *string
	init                           *string
	force, keepSetid               *bool
	diskMiB                        *int
}

func addImportFlags(fs *pflag.FlagSet) importFlags {
	return importFlags{
		state:     fs.String("state-dir", defaultStateDir(), "state directory"),
		out:       fs.String("out", "", "output directory (default STATE/images/NAME)"),
		name:      fs.String("name", "", "image name for profile.image"),
		force:     fs.Bool("force", false, "import again even if an up-to-date image exists"),
		keepSetid: fs.Bool("keep-setid", false, "keep set-user-ID and set-group-ID bits (docs/security.md: a command may become the guest's root through them)"),
		init: fs.String("init", imagebuild.InitAgent, "how the root starts: "+imagebuild.InitAgent+" (the guest agent is its init) or "+
			imagebuild.InitImage+" (its own systemd is, and starts the agent: docs/images.md)"),
		agent:   fs.String("agent", "", "guest agent binary (default: vmgate-agent beside vmgated)"),
		diskMiB: fs.Int("disk-size", 4096, "guest root filesystem size in MiB"),
		level:   fs.String("log-level", "info", "log level"),
	}
}

// options checks the flags and makes the options of an import of
// source.
func (f importFlags) options(source string) (imagebuild.ImportOptions, error) {
	if *f.name == "" && *f.out == "" {
		return imagebuild.ImportOptions{}, fmt.Errorf("%w: give the image a --name (profiles select it with image = \"NAME\")", errUsage)
	}
	lvl, err := parseLogLevel(*f.level)
	if err != nil {
		return imagebuild.ImportOptions{}, err
	}
	out, err := imageTarget(*f.state, *f.out, *f.name)
	if err != nil {
		return imagebuild.ImportOptions{}, err
	}
	log := newLogger(os.Stderr, lvl)
	var progress io.Writer
	if human(os.Stderr) {
		progress = os.Stderr
		log = newLogger(io.Discard, lvl)
	}
	return imagebuild.ImportOptions{OutDir: out, Source: source, AgentPath: *f.agent, DiskSizeMiB: *f.diskMiB,
		Force: *f.force, KeepSetid: *f.keepSetid, Init: *f.init, Log: log, Progress: progress}, nil
}

// imageImport runs `vmgated image import`: an image from a root file
// system tarball (docker export), a docker save archive or an OCI image
// layout, for profile.image.
func imageImport(fs *pflag.FlagSet) runFunc {
	f := addImportFlags(fs)
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("%w: want one tarball, archive or layout after the flags", errUsage)
		}
		opts, err := f.options(args[0])
		if err != nil {
			return err
		}
		res, err := imagebuild.Import(ctx, opts)
		if err != nil {
			return err
		}
		printImported(opts.OutDir, res)
		return nil
	}
}

// imagePull runs `vmgated image pull`: an image from a registry.
func imagePull(fs *pflag.FlagSet) runFunc {
	f := addImportFlags(fs)
	timeout := fs.Duration("timeout", imagebuild.DefaultPullTimeout, "bound on the whole pull")
	return func(ctx context.Context, args []string) error {
		if len(args) != 1 {
			return fmt.Errorf("%w: want one image reference after the flags", errUsage)
		}
		if *f.name == "" && *f.out == "" {
			n, err := defaultImageName(args[0])
			if err != nil {
				return err
			}
			*f.name = n
		}
		opts, err := f.options(args[0])
		if err != nil {
			return err
		}
		res, err := imagebuild.Pull(ctx, imagebuild.PullOptions{ImportOptions: opts, Timeout: *timeout})
		if err != nil {
			return err
		}
		printImported(opts.OutDir, res)
		return nil
	}
}

// defaultImageName is the image name a pull of ref gets without --name:
// its repository's last element ("python" for python:3.12-slim), when
// that is a valid image name.
func defaultImageName(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("%w: %v", errUsage, err)
	}
	n := path.Base(r.Context().RepositoryStr())
	if !names.Image(n) {
		return "", fmt.Errorf("%w: %q is no image name (%s): give one with --name", errUsage, n, names.ImageRule)
	}
	return n, nil
}

func printImported(out string, res *imagebuild.Result) {
	state := "imported"
	if res.Cached {
		state = "up to date"
	}
	m := res.Manifest
	var from string
	if s := m.Source; s != nil && s.Kind != image.SourceRootFS {
		from = fmt.Sprintf(" from %s %s", s.Reference, cmpStr(s.ManifestDigest, s.ConfigDigest))
	}
	fmt.Printf("image %s: %s%s (kernel %s, %d packages, base.qcow2 %d MiB)\n", state, out, from, m.KernelVersion, len(m.Packages), m.Artifacts[image.BaseFile].Size>>20)
}

func cmpStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
