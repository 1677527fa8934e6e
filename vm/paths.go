package vm

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vmgate/vmgate/vm/image"
)

// Directories. QEMU is given paths under the state, template and image
// directories, and its jail (package isolate) binds each file it needs at
// that file's real path in a fresh root. A path that reaches a directory
// through a symlink (/srv/img-current -> /data/img-2026-12, or a state
// directory on a data disk) therefore names nothing inside the jail: the
// link is not there. So the directories of a Runtime, Options and
// HostConfig are resolved once, where a program starts (ResolveDirs, or
// ResolveDir for each), and only the resolved paths are used from then
// on: the daemon and its jails agree, and a link changed later does not
// move files under a running VM.

// The state directory's subdirectories of VMs and of named images.
const (
	vmsSubdir    = "vms"
	imagesSubdir = "images"
)

// ResolveDir returns the directory dir names now as an absolute path
// without symlinks. When dir is not a usable directory the error names the
// cause: the path component that does not exist, a symlink whose target
// does not exist, a loop of symlinks, a file where a directory should be,
// or a directory the process may not search; it wraps fs.ErrNotExist when
// something on the path does not exist.
// Its errors are *DirError.
func ResolveDir(dir string) (string, error) {
	real, err := resolveDir(dir)
	if err != nil {
		return "", &DirError{Dir: dir, Err: err}
	}
	return real, nil
}

// DirError is a directory that cannot be used; its text names the cause.
type DirError struct {
	Dir string // as given
	Err error
}

func (e *DirError) Error() string { return e.Err.Error() }
func (e *DirError) Unwrap() error { return e.Err }

func resolveDir(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("no directory given")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", explainPath(abs, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", explainPath(abs, err)
	}
	if !fi.IsDir() {
		if real != abs {
			return "", fmt.Errorf("%s leads to %s, which is not a directory", abs, real)
		}
		return "", fmt.Errorf("%s is not a directory", abs)
	}
	return real, nil
}

// danglingLink is a symlink on a path whose target does not exist.
type danglingLink struct{ link, target string }

func (e *danglingLink) Error() string {
	return fmt.Sprintf("%s is a symlink to %s, which does not exist: point the link at an existing directory, or give the directory itself", e.link, e.target)
}

func (e *danglingLink) Unwrap() error { return fs.ErrNotExist }

// explainPath finds why the absolute path p does not resolve (cause is
// what resolving it returned): the first of its components that is
// missing, a dangling or looping symlink, not a directory, or not
// searchable.
func explainPath(p string, cause error) error {
	q := "/"
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		q = filepath.Join(q, part)
		fi, err := os.Lstat(q)
		if err != nil {
			return pathProblem(q, p, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(q)
			st, err := os.Stat(q)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				return &danglingLink{link: q, target: target}
			case errors.Is(err, syscall.ELOOP):
				return fmt.Errorf("%s is a symlink to %s in a loop of symlinks: point it at a directory", q, target)
			case err != nil:
				return pathProblem(q, p, err)
			}
			fi = st
		}
		if !fi.IsDir() && q != p {
			return fmt.Errorf("%s is not a directory (on the path %s)", q, p)
		}
	}
	return fmt.Errorf("%s: %w", p, cause)
}

// pathProblem is the error of q, a component of the path p, that could not
// be looked at.
func pathProblem(q, p string, err error) error {
	on := ""
	if q != p {
		on = " (on the path " + p + ")"
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return &explained{q + " does not exist" + on, fs.ErrNotExist}
	case errors.Is(err, fs.ErrPermission):
		return &explained{fmt.Sprintf("%s%s: permission denied: uid %d must be allowed to search every directory on the path and on its links' targets",
			q, on, os.Geteuid()), fs.ErrPermission}
	}
	return fmt.Errorf("%s%s: %w", q, on, err)
}

// explained is an error whose text says all, wrapping the kind of error
// it is.
type explained struct {
	msg  string
	kind error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.kind }

// ResolveImageDir is ResolveDir for an image directory: one that does not
// exist is an image not built (image.ErrNotBuilt, with the command that
// builds it), unless a symlink on its path leads nowhere (a *DirError, as
// every other path problem).
func ResolveImageDir(dir string) (string, error) {
	real, err := ResolveDir(dir)
	var dl *danglingLink
	if errors.Is(err, fs.ErrNotExist) && !errors.As(err, &dl) {
		abs, _ := filepath.Abs(dir)
		return "", fmt.Errorf("%s: %w (run: vmgated image build --out %s)", abs, image.ErrNotBuilt, abs)
	}
	return real, err
}

// ResolveNewDir creates dir (and its parents) with perm when nothing is
// there, then resolves it (ResolveDir).
func ResolveNewDir(dir string, perm fs.FileMode) (string, error) {
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, perm); err != nil {
			if real, rerr := ResolveDir(dir); rerr != nil {
				return real, rerr // says which component is in the way
			}
			return "", fmt.Errorf("create %s: %w", dir, err)
		}
	}
	return ResolveDir(dir)
}

// ResolveDirs resolves the runtime's directories in place (ResolveDir):
// StateDir, which must exist, and TemplateDir (default StateDir/templates),
// created (0700) when missing. StateDir/vms, where VM directories are
// made, must not be a symlink: link the state directory itself.
func (r *Runtime) ResolveDirs() error {
	state, err := ResolveDir(r.StateDir)
	if err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	vms := filepath.Join(state, vmsSubdir)
	if fi, err := os.Lstat(vms); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("state directory: %s is a symlink; VMs' directories are bound into their jails at their real paths and must be reached through none: link the state directory itself instead", vms)
	}
	tmpl := r.TemplateDir
	if tmpl == "" {
		tmpl = filepath.Join(state, templatesDir)
	}
	if tmpl, err = ResolveNewDir(tmpl, 0o700); err != nil {
		return fmt.Errorf("template directory: %w", err)
	}
	r.StateDir, r.TemplateDir = state, tmpl
	return nil
}

// ResolveDirs resolves the runtime's directories and the image directory
// in place (Runtime.ResolveDirs, ResolveImageDir).
func (o *Options) ResolveDirs() error {
	if err := o.Runtime.ResolveDirs(); err != nil {
		return err
	}
	img, err := ResolveImageDir(o.ImageDir)
	if err != nil {
		return fmt.Errorf("image directory: %w", err)
	}
	o.ImageDir = img
	return nil
}

// ResolveDirs resolves the runtime's directories, the default image's and
// the images directory (default StateDir/images) in place
// (Runtime.ResolveDirs, ResolveImageDir, ResolveDir). An images directory
// that does not exist yet is kept as it is: a named image is resolved when
// it is used (Host.UseImages).
func (c *HostConfig) ResolveDirs() error {
	if err := c.Runtime.ResolveDirs(); err != nil {
		return err
	}
	img, err := ResolveImageDir(c.ImageDir)
	if err != nil {
		return fmt.Errorf("image directory: %w", err)
	}
	images := c.ImagesDir
	if images == "" {
		images = filepath.Join(c.StateDir, imagesSubdir)
	}
	if _, err := os.Lstat(images); err == nil {
		if images, err = ResolveDir(images); err != nil {
			return fmt.Errorf("images directory: %w", err)
		}
	} else if images, err = filepath.Abs(images); err != nil {
		return fmt.Errorf("images directory: %w", err)
	}
	c.ImageDir, c.ImagesDir = img, images
	return nil
}
