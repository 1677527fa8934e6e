package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"

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
	Templates int      `json:"templates"` // VM templates built from it
	Error     string   `json:"error,omitempty"`
}

func imageList(args []string) error {
	fs := flag.NewFlagSet("vmgated image list", flag.ContinueOnError)
	state := fs.String("state-dir", defaultStateDir(), "state directory")
	imgDir := fs.String("image", "", "the default image's directory (default STATE/image)")
	templateDir := fs.String("template-dir", "", "VM template directory (default STATE/templates)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
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
		if e.IsDir() && image.ValidName(e.Name()) && e.Name() != vm.DefaultImage {
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
	fmt.Fprintln(tw, "NAME\tSUITE\tKERNEL\tPACKAGES\tSIZE\tTEMPLATES\tDIR")
	for _, i := range out {
		if i.Error != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t%s (%s)\n", i.Name, i.Dir, i.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d MiB\t%d\t%s\n", i.Name, i.Suite, i.Kernel, len(i.Packages), i.SizeBytes>>20, i.Templates, i.Dir)
	}
	return tw.Flush()
}

func describeImage(name, dir string, templates map[string]int) imageInfo {
	info := imageInfo{Name: name, Dir: dir}
	m, err := image.ReadManifest(dir)
	if err != nil {
		info.Error = "not built"
		return info
	}
	info.Suite, info.Kernel, info.Packages = m.Inputs.Suite, m.KernelVersion, m.Inputs.Packages
	for _, a := range m.Artifacts {
		info.SizeBytes += a.Size
	}
	info.Templates = templates[m.Artifacts[image.BaseFile].SHA256]
	return info
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
