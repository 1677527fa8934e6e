package imagebuild

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/vmgate/vmgate/vm/image"
)

// dpkgStatusFile is dpkg's database of a root file system, relative to it.
const dpkgStatusFile = "var/lib/dpkg/status"

// maxDpkgStatus bounds the dpkg status file read from a root: a large
// Debian system's is a few MiB; a hostile tarball's must not fill the
// importer's memory.
const maxDpkgStatus = 64 << 20

// readPackages returns the packages installed in the root r, from its
// dpkg status file read in Go through r: nothing runs, and no link leads
// out of the root (os.Root refuses absolute and escaping links). A status
// file over max bytes (maxDpkgStatus but in tests) is an error; a root
// without dpkg has no packages.
func readPackages(r *os.Root, max int64) ([]image.Package, error) {
	b, err := readCapped(r, dpkgStatusFile, max)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("package list: %w", err)
	}
	pkgs, err := parseDpkgStatus(string(b))
	if err != nil {
		return nil, fmt.Errorf("package list: %s: %w", dpkgStatusFile, err)
	}
	return pkgs, nil
}

// dpkgPresent are the dpkg package states in which a package's files are
// on the system. The others, not-installed and config-files (removed,
// its configuration kept), are not installed packages.
var dpkgPresent = []string{"installed", "half-installed", "unpacked", "half-configured", "triggers-awaited", "triggers-pending"}

// dpkgStates are every state a dpkg status file may name.
var dpkgStates = append([]string{"not-installed", "config-files"}, dpkgPresent...)

// parseDpkgStatus parses a dpkg status file (deb822 stanzas: "Field:
// value" lines, continuation lines starting with a space or a tab,
// stanzas separated by blank lines; field names in any case) and returns
// the name and version of each package whose state is one of
// dpkgPresent, sorted by name, then version (a package of two
// architectures appears twice, as dpkg-query -W lists it).
//
// It is strict as dpkg is: a stanza without Package or Status, a present
// package without Version, a field given twice, a name or version with
// characters dpkg refuses, or a line that is neither a field nor a
// continuation is an error naming its line. It is pure, and never
// panics.
func parseDpkgStatus(s string) ([]image.Package, error) {
	var out []image.Package
	type stanza struct {
		start  int
		fields map[string]string
	}
	cur := stanza{fields: map[string]string{}}
	flush := func() error {
		if len(cur.fields) == 0 {
			return nil
		}
		f := cur.fields
		cur.fields = map[string]string{}
		name, ok := f["package"]
		if !ok {
			return fmt.Errorf("stanza at line %d: no Package field", cur.start)
		}
		if err := checkPackageName(name); err != nil {
			return fmt.Errorf("stanza at line %d: %w", cur.start, err)
		}
		status, ok := f["status"]
		if !ok {
			return fmt.Errorf("package %s (line %d): no Status field", name, cur.start)
		}
		words := strings.Fields(status)
		if len(words) != 3 || !slices.Contains(dpkgStates, words[2]) {
			return fmt.Errorf("package %s (line %d): status %q is not WANT FLAG STATE", name, cur.start, status)
		}
		if !slices.Contains(dpkgPresent, words[2]) {
			return nil
		}
		version := f["version"]
		if err := checkPackageVersion(version); err != nil {
			return fmt.Errorf("package %s (line %d): %w", name, cur.start, err)
		}
		out = append(out, image.Package{Name: name, Version: version})
		return nil
	}
	for i, line := range strings.Split(s, "\n") {
		n := i + 1
		switch {
		case strings.TrimSpace(line) == "":
			if err := flush(); err != nil {
				return nil, err
			}
			continue
		case line[0] == ' ' || line[0] == '\t':
			if len(cur.fields) == 0 {
				return nil, fmt.Errorf("line %d: a continuation line with no field before it", n)
			}
			continue
		}
		key, value, ok := strings.Cut(line, ":")
		if !ok || key == "" || strings.ContainsAny(key, " \t") {
			return nil, fmt.Errorf("line %d: %.40q is not a field", n, line)
		}
		key = strings.ToLower(key)
		if len(cur.fields) == 0 {
			cur.start = n
		}
		if _, dup := cur.fields[key]; dup {
			return nil, fmt.Errorf("line %d: field %s given twice in one stanza", n, key)
		}
		cur.fields[key] = strings.TrimSpace(value)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b image.Package) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Version, b.Version)
	})
	return out, nil
}

// checkPackageName applies dpkg's rule for package names: an ASCII letter
// or digit, then letters, digits and "-+._".
func checkPackageName(name string) error {
	if name == "" || !isAlnum(name[0]) || strings.ContainsFunc(name, func(r rune) bool {
		return r > 0x7f || !isAlnum(byte(r)) && !strings.ContainsRune("-+._", r)
	}) {
		return fmt.Errorf("%.80q is not a package name", name)
	}
	return nil
}

// checkPackageVersion applies dpkg's characters for versions: ASCII
// letters, digits and ".+-~:", at least one.
func checkPackageVersion(v string) error {
	if v == "" || strings.ContainsFunc(v, func(r rune) bool {
		return r > 0x7f || !isAlnum(byte(r)) && !strings.ContainsRune(".+-~:", r)
	}) {
		return fmt.Errorf("%.80q is not a package version", v)
	}
	return nil
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}
