package imagebuild

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/vmgate/vmgate/guest/agentproto"
)

// accountFiles are the account databases of an imported root, relative to
// it. passwd and group are always written; shadow and gshadow only when
// the root has them.
var accountFiles = struct{ passwd, group, shadow, gshadow string }{
	"etc/passwd", "etc/group", "etc/shadow", "etc/gshadow",
}

// maxAccountFile bounds each account file read from an imported root: a
// real one is a few KiB; a hostile tarball's must not fill the importer's
// memory.
const maxAccountFile = 16 << 20

// accounts are the contents of an imported root's account files; a file
// the root lacks is nil (passwd and group are then created).
type accounts struct {
	passwd, group, shadow, gshadow []byte
}

// firstGuestID is the lowest uid and gid the guest user gets.
const firstGuestID = 1000

// withGuestUser returns a with agentproto.UnprivilegedUser as a fresh,
// unprivileged user, and its id (uid and gid alike):
//   - every entry of that name in passwd, group, shadow and gshadow is
//     dropped, whatever its ids (a tarball's "agent" may be uid 0);
//   - the name is dropped from the other groups' member and admin lists
//     (a fresh user is in no group but its own);
//   - the new passwd and group entries have the first id from
//     firstGuestID that no remaining entry uses as a uid or a gid;
//   - shadow and gshadow, when present, get a locked entry (no password:
//     the agent switches to the user, nobody logs in as it).
//
// Lines are matched as the guest's account lookups do (blank space
// around a line is ignored); comments and other lines are kept as they
// are. It is pure: the effects are in addGuestUser.
func withGuestUser(a accounts, shell string) (accounts, int) {
	name := agentproto.UnprivilegedUser
	var out accounts
	out.passwd = []byte(dropEntries(string(a.passwd), name, nil))
	out.group = []byte(dropEntries(string(a.group), name, []int{3}))
	used := map[int]bool{}
	for _, file := range []string{string(out.passwd), string(out.group)} {
		for _, line := range strings.Split(file, "\n") {
			f := strings.Split(strings.TrimSpace(line), ":")
			for _, i := range []int{2, 3} {
				if len(f) > i {
					if n, err := strconv.Atoi(f[i]); err == nil {
						used[n] = true
					}
				}
			}
		}
	}
	id := firstGuestID
	for used[id] {
		id++
	}
	out.passwd = fmt.Appendf(terminated(out.passwd), "%s:x:%d:%d::/home/%s:%s\n", name, id, id, name, shell)
	out.group = fmt.Appendf(terminated(out.group), "%s:x:%d:\n", name, id)
	if a.shadow != nil {
		out.shadow = fmt.Appendf(terminated([]byte(dropEntries(string(a.shadow), name, nil))), "%s:!:::::::\n", name)
	}
	if a.gshadow != nil {
		out.gshadow = fmt.Appendf(terminated([]byte(dropEntries(string(a.gshadow), name, []int{2, 3}))), "%s:!::\n", name)
	}
	return out, id
}

// dropEntries removes the entries of name from a colon file, and name
// from the comma-separated lists in the fields of the other entries at
// the indexes in lists.
func dropEntries(file, name string, lists []int) string {
	lines := strings.SplitAfter(file, "\n")
	out := lines[:0]
	for _, line := range lines {
		trimmed := strings.TrimSpace(line)
		if n, _, ok := strings.Cut(trimmed, ":"); ok && n == name {
			continue
		}
		if len(lists) > 0 && trimmed != "" && !strings.HasPrefix(trimmed, "#") {
			f := strings.Split(trimmed, ":")
			changed := false
			for _, i := range lists {
				if i >= len(f) || f[i] == "" {
					continue
				}
				members := strings.Split(f[i], ",")
				kept := members[:0]
				for _, m := range members {
					if strings.TrimSpace(m) != name {
						kept = append(kept, m)
					}
				}
				if len(kept) != len(members) {
					f[i], changed = strings.Join(kept, ","), true
				}
			}
			if changed {
				line = strings.Join(f, ":") + "\n"
			}
		}
		out = append(out, line)
	}
	return strings.Join(out, "")
}

func terminated(b []byte) []byte {
	if len(b) > 0 && b[len(b)-1] != '\n' {
		return append(b, '\n')
	}
	return b
}

// addGuestUser makes agentproto.UnprivilegedUser a fresh user of the
// root r (withGuestUser) with its home directory. Each account file is
// replaced, not written through: one that is a link (symbolic or hard)
// to another file of the root leaves that file alone.
func addGuestUser(r *os.Root) error {
	var a accounts
	files := []struct {
		path string
		data *[]byte
		out  func(*accounts) []byte
	}{
		{accountFiles.passwd, &a.passwd, func(a *accounts) []byte { return a.passwd }},
		{accountFiles.group, &a.group, func(a *accounts) []byte { return a.group }},
		{accountFiles.shadow, &a.shadow, func(a *accounts) []byte { return a.shadow }},
		{accountFiles.gshadow, &a.gshadow, func(a *accounts) []byte { return a.gshadow }},
	}
	for _, f := range files {
		b, err := readCapped(r, f.path, maxAccountFile)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		*f.data = b
	}
	shell := "/bin/sh"
	if _, err := r.Stat("bin/bash"); err == nil {
		shell = "/bin/bash"
	}
	out, id := withGuestUser(a, shell)
	if err := r.MkdirAll("etc", 0o755); err != nil {
		return err
	}
	for _, f := range files {
		if b := f.out(&out); b != nil {
			if err := replaceFile(r, f.path, b); err != nil {
				return err
			}
		}
	}
	home := "home/" + agentproto.UnprivilegedUser
	if err := r.MkdirAll(home, 0o755); err != nil {
		return err
	}
	return r.Lchown(home, id, id)
}

// readCapped reads the file at path in r, refusing one over max bytes.
func readCapped(r *os.Root, path string, max int64) ([]byte, error) {
	f, err := r.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("read %s: larger than %d bytes", path, max)
	}
	return b, nil
}

// replaceFile replaces the file at path in r with a new one holding data,
// with the old file's permissions and owner (those of a new account file
// when there was none, or it was not a regular file).
func replaceFile(r *os.Root, path string, data []byte) error {
	mode, uid, gid := os.FileMode(0o644), 0, 0
	if strings.HasSuffix(path, "shadow") {
		mode = 0o640
	}
	if fi, err := r.Lstat(path); err == nil && fi.Mode().IsRegular() {
		mode = fi.Mode().Perm()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			uid, gid = int(st.Uid), int(st.Gid)
		}
	}
	if err := r.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := r.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := r.Lchown(path, uid, gid); err != nil {
		return err
	}
	return r.Chmod(path, mode)
}
