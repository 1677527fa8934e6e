package imagebuild

import (
	"errors"
	"fmt"
	"path"
	"strings"
)

// Whiteout names, as container image layers mark deletions (the OCI
// image specification's layer format, after aufs): ".wh.NAME" hides NAME
// of the layers below in the same directory; ".wh..wh..opq" makes its
// directory opaque (what the layers below put in it is hidden). Other
// names beginning ".wh..wh." are aufs's own bookkeeping and are skipped.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// entryKind is what a tar entry's name asks of the unpacker.
type entryKind int

const (
	entryFile     entryKind = iota // create the entry at its path
	entryWhiteout                  // remove the path from the layers below
	entryOpaque                    // the directory at the path is opaque
	entrySkip                      // aufs bookkeeping: nothing
)

// errBadName reports a tar entry name that would lead out of the root.
var errBadName = errors.New("an entry's name leads out of the root")

// entryPath is the path, relative to the root and clean, that a tar
// entry's name (or a hard link's target) names: "." for the root
// itself. Names are the tarball's, so untrusted: an absolute name or
// one with a ".." element is refused (errBadName) rather than
// reinterpreted, since an archive that holds one was made to reach the
// host or is broken.
func entryPath(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: an empty name", errBadName)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: %q is absolute", errBadName, name)
	}
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: %q holds a NUL", errBadName, name)
	}
	for el := range strings.SplitSeq(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: %q has a \"..\" element", errBadName, name)
		}
	}
	return path.Clean(name), nil
}

// layerEntry says what a layer's tar entry name asks for: the path to
// create, or the path a whiteout removes, or the directory it makes
// opaque. In a root file system tarball (not a layer) every name is
// entryFile: ".wh." names mean nothing there.
func layerEntry(name string, layer bool) (entryKind, string, error) {
	p, err := entryPath(name)
	if err != nil || !layer {
		return entryFile, p, err
	}
	dir, base := path.Split(p)
	dir = path.Clean(dir) // "" becomes "."
	switch {
	case base == whiteoutOpaque:
		return entryOpaque, dir, nil
	case hasMetaElement(p):
		// .wh..wh.plnk/… and the like: aufs's own files.
		return entrySkip, p, nil
	case strings.HasPrefix(base, whiteoutPrefix):
		target := strings.TrimPrefix(base, whiteoutPrefix)
		if target == "" || target == "." || target == ".." {
			return entryFile, "", fmt.Errorf("%w: whiteout %q names no file", errBadName, name)
		}
		return entryWhiteout, path.Join(dir, target), nil
	}
	return entryFile, p, nil
}

// hasMetaElement reports a path with an element that is aufs's.
func hasMetaElement(p string) bool {
	for el := range strings.SplitSeq(p, "/") {
		if strings.HasPrefix(el, whiteoutMeta) {
			return true
		}
	}
	return false
}
