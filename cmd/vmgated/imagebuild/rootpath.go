package imagebuild

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
)

// A layer's entry may name a path through a symlink an earlier entry or
// layer made: Debian's /var/run -> /run, /var/lock -> /run/lock, a
// builder's /opt/app -> /srv/app. In the guest an absolute link target
// starts at the guest's root, so a container runtime follows such links
// inside the image's root. os.Root does not: it refuses every absolute
// link, so the entry, and with it the whole import, would fail.
//
// parentIn resolves the directory part of an entry's path as the guest
// would see it, before the unpacker writes through os.Root:
//   - an absolute target starts again at the root;
//   - a relative target is taken from the link's directory, and one that
//     climbs above the root is refused (as os.Root would: an entry that
//     leads out of the root is a hostile layer, not a guest's path);
//   - at most maxLinkHops links are followed (a loop is refused).
//
// The last element is not followed: an entry replaces a link, it does
// not write through it. The result names no symlink in its directory
// part when parentIn returns, and every write still goes through os.Root,
// which refuses whatever would leave the root.

// maxLinkHops bounds the symlinks one path's resolution follows, as
// Linux's 40.
const maxLinkHops = 40

// errLinkOut reports a relative symlink that leads an entry above the
// root.
var errLinkOut = errors.New("a symlink leads it out of the root")

// linkReader is what parentIn reads of a tree: *os.Root has both.
type linkReader interface {
	Lstat(name string) (fs.FileInfo, error)
	Readlink(name string) (string, error)
}

// parentIn is p ("." or a clean relative path, as entryPath gives) with
// its directory part resolved in r.
func parentIn(r linkReader, p string) (string, error) {
	if p == "." || !strings.Contains(p, "/") {
		return p, nil
	}
	dir, err := resolveIn(r, path.Dir(p))
	if err != nil {
		return "", fmt.Errorf("%s: %w", path.Dir(p), err)
	}
	return path.Join(dir, path.Base(p)), nil
}

// resolveIn resolves every element of dir in r, following symlinks as
// the package comment says. Elements that do not exist are kept as they
// are: the unpacker makes them as directories.
func resolveIn(r linkReader, dir string) (string, error) {
	done := "."
	todo := strings.Split(dir, "/")
	hops := 0
	for len(todo) > 0 {
		el := todo[0]
		todo = todo[1:]
		switch el {
		case "", ".":
			continue
		case "..":
			if done == "." {
				return "", errLinkOut
			}
			done = path.Dir(done)
			continue
		}
		next := path.Join(done, el)
		fi, err := r.Lstat(next)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Nothing is there, so no link either: the rest is made, but
			// a link's ".." cannot step back out of what is not there.
			if slices.Contains(todo, "..") {
				return "", fmt.Errorf("%s: %w", next, fs.ErrNotExist)
			}
			return path.Join(append([]string{next}, todo...)...), nil
		case err != nil:
			return "", err
		case fi.Mode()&os.ModeSymlink == 0:
			done = next
			continue
		}
		if hops++; hops > maxLinkHops {
			return "", fmt.Errorf("more than %d symlinks (a loop?)", maxLinkHops)
		}
		target, err := r.Readlink(next)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(target, "/") {
			done = "."
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return done, nil
}

// statIn is the file p (a clean relative path) leads to in r, every link
// on the way, its last element too, followed as the guest would
// (resolveIn).
func statIn(r *os.Root, p string) (fs.FileInfo, error) {
	q, err := resolveIn(r, p)
	if err != nil {
		return nil, err
	}
	return r.Lstat(q)
}
