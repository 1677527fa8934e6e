// Package initramfs builds the small initramfs that vmgate boots its guest
// kernels with.
//
// The archive is an uncompressed newc cpio (see [WriteNewc]) holding the
// guest init program as /init, the kernel modules the guest needs to reach
// its root file system, and the few directories and device nodes /init
// expects. The modules are resolved with [ResolveModules] from an unpacked
// kernel package, which has no modules.dep, by reading each module's
// .modinfo section.
//
// Layout written by [Build]:
//
//	dev/            0755
//	dev/console     0600 character device 5:1
//	dev/null        0666 character device 1:3
//	proc/           0555
//	sys/            0555
//	root/           0755  mount point for the real root file system
//	modules/        0755
//	init            0755  the guest init program
//	modules/<name>.ko  0644, one per module
//	modules/order   0644  the .ko file names, one per line, in load order
//
// The output depends only on the inputs, so equal inputs give byte-identical
// archives.
package initramfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// Paths inside the archive. The guest side (package boot) reads the
// same paths.
const (
	// InitPath is the archive path of the init program.
	InitPath = "init"
	// ModulesDir is the archive directory holding the module files.
	ModulesDir = "modules"
	// ModuleOrderPath is the archive path of the load order file.
	ModuleOrderPath = ModulesDir + "/order"
)

// Build writes an initramfs to w containing initBinary as /init and the given
// modules, which are loaded in the order given (normally the order
// [ResolveModules] returns). Each module is stored as modules/<Name>.ko, read
// from its Path; modules/order lists those file names one per line.
func Build(w io.Writer, initBinary []byte, modules []Module) error {
	if len(initBinary) == 0 {
		return errors.New("build initramfs: empty init binary")
	}
	entries := []Entry{
		{Name: "dev", Mode: fs.ModeDir | 0o755},
		{Name: "dev/console", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o600, DevMajor: 5, DevMinor: 1},
		{Name: "dev/null", Mode: fs.ModeDevice | fs.ModeCharDevice | 0o666, DevMajor: 1, DevMinor: 3},
		{Name: "proc", Mode: fs.ModeDir | 0o555},
		{Name: "sys", Mode: fs.ModeDir | 0o555},
		{Name: "root", Mode: fs.ModeDir | 0o755},
		{Name: ModulesDir, Mode: fs.ModeDir | 0o755},
		{Name: InitPath, Mode: 0o755, Data: initBinary},
	}
	var order bytes.Buffer
	seen := make(map[string]bool, len(modules))
	for _, m := range modules {
		name := NormalizeModuleName(m.Name)
		if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00\n") {
			return fmt.Errorf("build initramfs: invalid module name %q", m.Name)
		}
		if seen[name] {
			return fmt.Errorf("build initramfs: module %s listed twice", name)
		}
		seen[name] = true
		data, err := os.ReadFile(m.Path)
		if err != nil {
			return fmt.Errorf("build initramfs: read module %s: %w", name, err)
		}
		file := name + ".ko"
		entries = append(entries, Entry{Name: ModulesDir + "/" + file, Mode: 0o644, Data: data})
		order.WriteString(file + "\n")
	}
	entries = append(entries, Entry{Name: ModuleOrderPath, Mode: 0o644, Data: order.Bytes()})
	if err := WriteNewc(w, entries); err != nil {
		return fmt.Errorf("build initramfs: %w", err)
	}
	return nil
}
