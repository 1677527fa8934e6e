package imagebuild

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// lockOut takes an exclusive lock next to the output directory so that two
// builds of the same image cannot interleave. The returned func releases it.
func lockOut(out string) (func(), error) {
	p := filepath.Join(filepath.Dir(out), "."+filepath.Base(out)+".lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("image build: lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("image build: another build of %s is running (lock %s)", out, p)
		}
		return nil, fmt.Errorf("image build: lock %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}

// removeBuildDir removes a build directory that an interrupted mmdebstrap
// may have left with file systems mounted inside (proc, sys, dev in root
// mode). It detaches those mounts first and never descends into a mount it
// could not detach, so host /dev or /proc are never touched.
func removeBuildDir(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	// Deepest first.
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, m := range mounts {
		_ = unix.Unmount(m, unix.MNT_DETACH)
	}
	return removeSameDevice(dir)
}

// mountsUnder lists mount points strictly below dir, from /proc/self/mountinfo.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("list mounts: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, sc.Err()
}

// unescapeMount undoes the octal escapes (\040 etc.) of mountinfo paths.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			v := (int(s[i+1]-'0') << 6) | (int(s[i+2]-'0') << 3) | int(s[i+3]-'0')
			b.WriteByte(byte(v))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeSameDevice is os.RemoveAll that refuses to cross into another file
// system: a directory on another device is reported, not emptied.
func removeSameDevice(dir string) error {
	var root unix.Stat_t
	if err := unix.Lstat(dir, &root); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	var stuck []string
	var dirs []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return os.Remove(p)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Dev != root.Dev {
			stuck = append(stuck, p)
			return filepath.SkipDir
		}
		dirs = append(dirs, p)
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if len(stuck) > 0 {
		return fmt.Errorf("remove %s: file systems still mounted at %s; unmount them and remove the directory", dir, strings.Join(stuck, ", "))
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := os.Remove(dirs[i]); err != nil {
			return fmt.Errorf("remove %s: %w", dir, err)
		}
	}
	return nil
}
