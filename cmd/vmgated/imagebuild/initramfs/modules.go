package initramfs

import (
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// maxModInfoSize bounds the .modinfo section ReadModInfo is willing to load.
// Real sections are a few hundred bytes to a few kilobytes.
const maxModInfoSize = 1 << 20

// ModInfo is the part of a kernel module's .modinfo section that module
// resolution uses. All module names in it are normalised with
// [NormalizeModuleName].
type ModInfo struct {
	// Name is the value of name=, or "" when the section has none.
	Name string
	// Depends lists the modules named by depends=, in order, without
	// duplicates. These must be loaded before the module.
	Depends []string
	// SoftPre lists the modules named after "pre:" in softdep= values.
	// modprobe loads them, if it can, before the module.
	SoftPre []string
	// SoftPost lists the modules named after "post:" in softdep= values.
	SoftPost []string
	// Vermagic is the value of vermagic=, the kernel build the module is for.
	Vermagic string
}

// Module is one kernel module file chosen by [ResolveModules].
type Module struct {
	// Name is the normalised module name, e.g. "virtio_rng".
	Name string
	// Path is the absolute path of the .ko file.
	Path string
	// RelPath is Path relative to the modules root, slash-separated, e.g.
	// "kernel/drivers/char/hw_random/virtio-rng.ko".
	RelPath string
	// Depends lists the module's hard dependencies (normalised names).
	Depends []string
}

var (
	// ErrModuleNotFound is wrapped by ResolveModules errors that report
	// wanted modules or hard dependencies missing from the module tree.
	ErrModuleNotFound = errors.New("module not found")
	// ErrDependencyCycle is wrapped by ResolveModules errors that report a
	// cycle of hard dependencies.
	ErrDependencyCycle = errors.New("module dependency cycle")
)

// NormalizeModuleName returns the kernel's spelling of a module name: the
// kernel and kmod treat '-' and '_' in module names as the same character and
// use '_' internally, so file crc32c-intel.ko is module crc32c_intel.
func NormalizeModuleName(name string) string {
	return strings.ReplaceAll(name, "-", "_")
}

// ParseModInfo parses the contents of a .modinfo section: NUL-separated
// key=value strings. Strings without '=' and unknown keys are ignored; repeated
// depends= and softdep= values accumulate. In softdep= values, names that
// precede any "pre:" or "post:" marker are ignored, as modprobe ignores them.
func ParseModInfo(data []byte) ModInfo {
	var mi ModInfo
	for _, s := range strings.Split(string(data), "\x00") {
		key, value, ok := strings.Cut(s, "=")
		if !ok {
			continue
		}
		switch key {
		case "name":
			mi.Name = NormalizeModuleName(value)
		case "vermagic":
			mi.Vermagic = value
		case "depends":
			for _, d := range strings.Split(value, ",") {
				mi.Depends = appendName(mi.Depends, d)
			}
		case "softdep":
			var list *[]string
			for _, tok := range strings.Fields(value) {
				switch {
				case tok == "pre:":
					list = &mi.SoftPre
				case tok == "post:":
					list = &mi.SoftPost
				case strings.HasSuffix(tok, ":"):
					list = nil // an unknown section: skip its names
				case list != nil:
					*list = appendName(*list, tok)
				}
			}
		}
	}
	return mi
}

// appendName appends the normalised, trimmed name to list unless it is empty
// or already present.
func appendName(list []string, name string) []string {
	name = NormalizeModuleName(strings.TrimSpace(name))
	if name == "" {
		return list
	}
	for _, n := range list {
		if n == name {
			return list
		}
	}
	return append(list, name)
}

// ReadModInfo reads and parses the .modinfo section of the kernel module
// (an ELF relocatable object) at path. Compressed modules (.ko.xz, .ko.zst)
// are not supported.
func ReadModInfo(path string) (ModInfo, error) {
	f, err := elf.Open(path)
	if err != nil {
		return ModInfo{}, fmt.Errorf("read modinfo: %w", err)
	}
	defer f.Close()
	mi, err := modInfoFromELF(f)
	if err != nil {
		return ModInfo{}, fmt.Errorf("read modinfo of %s: %w", path, err)
	}
	return mi, nil
}

// modInfoFromELF extracts and parses the .modinfo section of f.
func modInfoFromELF(f *elf.File) (ModInfo, error) {
	sec := f.Section(".modinfo")
	if sec == nil {
		return ModInfo{}, errors.New("no .modinfo section")
	}
	if sec.Type == elf.SHT_NOBITS {
		return ModInfo{}, errors.New(".modinfo section has no data")
	}
	if sec.Size > maxModInfoSize {
		return ModInfo{}, fmt.Errorf(".modinfo section is %d bytes, limit %d", sec.Size, maxModInfoSize)
	}
	data, err := sec.Data()
	if err != nil {
		return ModInfo{}, fmt.Errorf("read .modinfo section: %w", err)
	}
	return ParseModInfo(data), nil
}

// compressedSuffixes are module file suffixes that ResolveModules recognises
// only to explain why such a module cannot be used.
var compressedSuffixes = []string{".ko.xz", ".ko.zst", ".ko.gz"}

// ResolveModules finds the wanted modules and everything they need in the
// module tree modulesRoot, a lib/modules/<version> directory that need not
// contain modules.dep: dependencies are read from each module's .modinfo.
//
// Every .ko file under modulesRoot is indexed by its normalised file name
// (as depmod does). The result holds the wanted modules, their depends=
// closure and the "softdep pre:" modules that exist in the tree, each once,
// in load order: every module after its hard dependencies and the soft
// dependencies it could be ordered after. The order is deterministic: a
// depth-first walk of want in the given order, visiting each module's soft
// pre-dependencies and then its hard dependencies in .modinfo order.
//
// Missing soft dependencies are ignored (softdep= usually names aliases such
// as crypto-crc32c, which are not resolved), as are soft dependencies that
// would close a cycle. Wanted modules or hard dependencies missing from the
// tree, and cycles of hard dependencies, are errors wrapping
// [ErrModuleNotFound] and [ErrDependencyCycle]. A module whose name= differs
// from its file name, or a module name provided by two files, is an error.
func ResolveModules(modulesRoot string, want []string) ([]Module, error) {
	root, err := filepath.Abs(modulesRoot)
	if err != nil {
		return nil, fmt.Errorf("resolve modules: %w", err)
	}
	index, compressed, err := indexModules(root)
	if err != nil {
		return nil, fmt.Errorf("resolve modules: %w", err)
	}

	r := &resolver{
		root:    root,
		index:   index,
		info:    make(map[string]*node),
		missing: make(map[string][]string),
	}
	var wantNames, wantMissing []string
	for _, w := range want {
		name := NormalizeModuleName(w)
		if len(index[name]) == 0 {
			wantMissing = append(wantMissing, name)
			continue
		}
		wantNames = append(wantNames, name)
	}
	if err := r.collect(wantNames); err != nil {
		return nil, fmt.Errorf("resolve modules: %w", err)
	}
	if len(wantMissing) > 0 || len(r.missing) > 0 {
		return nil, fmt.Errorf("resolve modules: %w", missingError(wantMissing, r.missing, compressed))
	}
	if err := r.checkHardCycles(); err != nil {
		return nil, fmt.Errorf("resolve modules: %w", err)
	}
	r.addSoftEdges()
	return r.sort(wantNames), nil
}

// indexModules maps normalised module names to the slash-separated paths,
// relative to root, of the .ko files that provide them. It also records the
// names of compressed modules, which are not indexed.
func indexModules(root string) (map[string][]string, map[string]bool, error) {
	index := make(map[string][]string)
	compressed := make(map[string]bool)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		base := d.Name()
		for _, suf := range compressedSuffixes {
			if strings.HasSuffix(base, suf) {
				compressed[NormalizeModuleName(strings.TrimSuffix(base, suf))] = true
				return nil
			}
		}
		if !strings.HasSuffix(base, ".ko") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		name := NormalizeModuleName(strings.TrimSuffix(base, ".ko"))
		index[name] = append(index[name], filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("index %s: %w", root, err)
	}
	return index, compressed, nil
}

// node is one module of the closure and its outgoing edges, each pointing at
// a module that must be loaded first.
type node struct {
	mod  Module
	soft []string // existing soft pre-dependencies, in .modinfo order
	hard []string // hard dependencies, in .modinfo order
	// edges is the final ordering graph: the accepted soft edges, then the
	// hard ones.
	edges []string
}

// resolver holds the state of one ResolveModules call.
type resolver struct {
	root    string
	index   map[string][]string
	info    map[string]*node
	seq     []string            // modules of the closure in discovery order
	missing map[string][]string // missing hard dependency -> dependents
}

// collect reads the .modinfo of every module reachable from want through
// hard dependencies and existing soft pre-dependencies, recording missing
// hard dependencies in r.missing. Every name in want must be in r.index.
func (r *resolver) collect(want []string) error {
	queue := append([]string(nil), want...)
	for len(queue) > 0 {
		name := queue[0]
		queue = queue[1:]
		if r.info[name] != nil {
			continue
		}
		n, err := r.load(name)
		if err != nil {
			return err
		}
		r.info[name] = n
		r.seq = append(r.seq, name)
		queue = append(queue, n.soft...)
		queue = append(queue, n.hard...)
	}
	return nil
}

// load reads the module file providing name and sorts its dependencies into
// hard, soft (existing soft pre-dependencies) and missing.
func (r *resolver) load(name string) (*node, error) {
	paths := r.index[name]
	if len(paths) > 1 {
		return nil, fmt.Errorf("module %s is provided by several files: %s", name, strings.Join(paths, ", "))
	}
	rel := paths[0]
	abs := filepath.Join(r.root, filepath.FromSlash(rel))
	mi, err := ReadModInfo(abs)
	if err != nil {
		return nil, err
	}
	if mi.Name != "" && mi.Name != name {
		return nil, fmt.Errorf("module file %s declares name %q", rel, mi.Name)
	}
	n := &node{mod: Module{Name: name, Path: abs, RelPath: rel, Depends: mi.Depends}}
	for _, dep := range mi.Depends {
		if len(r.index[dep]) == 0 {
			r.missing[dep] = append(r.missing[dep], name)
			continue
		}
		n.hard = append(n.hard, dep)
	}
	for _, dep := range mi.SoftPre {
		if len(r.index[dep]) > 0 && dep != name {
			n.soft = append(n.soft, dep)
		}
	}
	return n, nil
}

// checkHardCycles reports a cycle made only of hard dependencies.
func (r *resolver) checkHardCycles() error {
	const (
		unvisited = iota
		visiting
		visited
	)
	state := make(map[string]int, len(r.info))
	var stack []string
	var visit func(name string) error
	visit = func(name string) error {
		switch state[name] {
		case visited:
			return nil
		case visiting:
			i := slices.Index(stack, name)
			cycle := append(slices.Clone(stack[i:]), name)
			return fmt.Errorf("%w: %s", ErrDependencyCycle, strings.Join(cycle, " -> "))
		}
		state[name] = visiting
		stack = append(stack, name)
		for _, dep := range r.info[name].hard {
			if err := visit(dep); err != nil {
				return err
			}
		}
		stack = stack[:len(stack)-1]
		state[name] = visited
		return nil
	}
	for _, name := range r.seq {
		if err := visit(name); err != nil {
			return err
		}
	}
	return nil
}

// addSoftEdges builds each node's ordering edges: its hard dependencies plus
// every soft pre-dependency that does not close a cycle, considered in
// discovery order.
func (r *resolver) addSoftEdges() {
	for _, name := range r.seq {
		r.info[name].edges = slices.Clone(r.info[name].hard)
	}
	for _, name := range r.seq {
		n := r.info[name]
		var accepted []string
		for _, dep := range n.soft {
			if !r.reaches(dep, name) {
				accepted = append(accepted, dep)
				// Visible to the next reachability checks at once.
				n.edges = append(n.edges, dep)
			}
		}
		// Soft pre-dependencies first, as modprobe loads them first.
		n.edges = append(accepted, n.hard...)
	}
}

// reaches reports whether to can be reached from from along ordering edges.
func (r *resolver) reaches(from, to string) bool {
	seen := map[string]bool{from: true}
	queue := []string{from}
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		if cur == to {
			return true
		}
		for _, next := range r.info[cur].edges {
			if !seen[next] {
				seen[next] = true
				queue = append(queue, next)
			}
		}
	}
	return false
}

// sort returns the closure in load order: a depth-first post-order walk from
// want, then from the rest of the closure in discovery order, along the
// ordering edges, which form an acyclic graph.
func (r *resolver) sort(want []string) []Module {
	done := make(map[string]bool, len(r.info))
	order := make([]Module, 0, len(r.info))
	var visit func(name string)
	visit = func(name string) {
		if done[name] {
			return
		}
		done[name] = true
		for _, dep := range r.info[name].edges {
			visit(dep)
		}
		order = append(order, r.info[name].mod)
	}
	for _, name := range want {
		visit(name)
	}
	// Modules reached only through soft edges that were dropped.
	for _, name := range r.seq {
		visit(name)
	}
	return order
}

// missingError describes every missing wanted module and hard dependency.
func missingError(wanted []string, deps map[string][]string, compressed map[string]bool) error {
	var parts []string
	hint := func(name string) string {
		if compressed[name] {
			return ", only a compressed module exists, which is not supported"
		}
		return ""
	}
	seen := make(map[string]bool)
	for _, name := range wanted {
		if !seen[name] {
			seen[name] = true
			parts = append(parts, fmt.Sprintf("%s (wanted%s)", name, hint(name)))
		}
	}
	names := make([]string, 0, len(deps))
	for name := range deps {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		parts = append(parts, fmt.Sprintf("%s (needed by %s%s)", name, strings.Join(deps[name], ", "), hint(name)))
	}
	return fmt.Errorf("%w: %s", ErrModuleNotFound, strings.Join(parts, "; "))
}
