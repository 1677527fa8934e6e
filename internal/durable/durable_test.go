package durable

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// synced records what fsync is called on while a test runs: the name of
// each file, and whether the target then held the new content.
type synced struct {
	names []string
	moved []bool
}

func recordSyncs(t *testing.T, target, want string, fail error) *synced {
	t.Helper()
	s := &synced{}
	old := fsync
	t.Cleanup(func() { fsync = old })
	fsync = func(f *os.File) error {
		s.names = append(s.names, f.Name())
		b, err := os.ReadFile(target)
		s.moved = append(s.moved, err == nil && string(b) == want)
		if fail != nil {
			return fail
		}
		return old(f)
	}
	return s
}

// TestWrite: the content and mode land whole under the name, a file
// that must be new is never replaced, the temporary file is synced
// before it moves and the directory after, and no temporary file is left
// behind, whether the write succeeds or fails.
func TestWrite(t *testing.T) {
	errSync := errors.New("sync failed")
	type write func(string, []byte, fs.FileMode) error
	for _, tc := range []struct {
		name  string
		write write
		// before prepares the directory (path is the target); it returns
		// what the target holds before the write ("" for nothing).
		before  func(t *testing.T, path string) string
		perm    fs.FileMode
		syncErr error
		wantErr error // wrapped by the error; nil: success, unless failed
		failed  bool  // the write fails, whatever the error
		// wantSyncs: the temporary file, then the directory (2), or
		// fewer when the write fails before.
		wantSyncs int
	}{
		{name: "new file", write: WriteFile, perm: 0o600, wantSyncs: 2},
		{name: "read-only mode", write: WriteFile, perm: 0o400, wantSyncs: 2},
		{name: "public mode", write: WriteFile, perm: 0o644, wantSyncs: 2},
		{name: "replaces", write: WriteFile, perm: 0o640, before: file("old"), wantSyncs: 2},
		{name: "new: absent", write: WriteNew, perm: 0o400, wantSyncs: 2},
		{name: "new: exists", write: WriteNew, perm: 0o400, before: file("old"), wantErr: fs.ErrExist, wantSyncs: 1},
		{name: "new: a dangling symlink", write: WriteNew, perm: 0o400, before: symlink("nowhere"), wantErr: fs.ErrExist, wantSyncs: 1},
		{name: "onto a directory", write: WriteFile, perm: 0o600, before: directory, failed: true, wantSyncs: 1},
		{name: "sync fails", write: WriteFile, perm: 0o600, before: file("old"), syncErr: errSync, wantErr: errSync, wantSyncs: 1},
		{name: "new: sync fails", write: WriteNew, perm: 0o600, syncErr: errSync, wantErr: errSync, wantSyncs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "meta.json")
			was := ""
			if tc.before != nil {
				was = tc.before(t, path)
			}
			entries := names(t, dir)
			const content = "{\"new\": true}\n"
			s := recordSyncs(t, path, content, tc.syncErr)
			err := tc.write(path, []byte(content), tc.perm)
			fails := tc.failed || tc.wantErr != nil
			switch {
			case !fails && err != nil:
				t.Fatalf("write: %v", err)
			case fails && err == nil, tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Fatalf("write: %v, want an error (%v)", err, tc.wantErr)
			case err != nil && !strings.Contains(err.Error(), path):
				t.Errorf("the error does not name the file: %v", err)
			}
			if len(s.names) != tc.wantSyncs {
				t.Errorf("synced %q, want %d syncs", s.names, tc.wantSyncs)
			}
			if len(s.names) > 0 && (!strings.HasPrefix(filepath.Base(s.names[0]), ".meta.json.tmp-") || filepath.Dir(s.names[0]) != dir || s.moved[0]) {
				t.Errorf("first sync: %s (target new: %v), want the temporary file beside the target, before it moves", s.names[0], s.moved[0])
			}
			if len(s.names) > 1 && (s.names[1] != dir || !s.moved[1]) {
				t.Errorf("second sync: %s (target new: %v), want the directory, once the file moved", s.names[1], s.moved[1])
			}
			// Nothing but the target is new in the directory.
			after := names(t, dir)
			if err == nil && !slices.Contains(entries, "meta.json") {
				entries = append(entries, "meta.json")
				slices.Sort(entries)
			}
			if !slices.Equal(after, entries) {
				t.Errorf("directory holds %q, want %q", after, entries)
			}
			if err != nil {
				if tc.before != nil && was != "" {
					if b, rerr := os.ReadFile(path); rerr != nil || string(b) != was {
						t.Errorf("after a failed write the target holds %q (%v), want %q", b, rerr, was)
					}
				}
				return
			}
			b, rerr := os.ReadFile(path)
			if rerr != nil || string(b) != content {
				t.Errorf("target holds %q (%v), want %q", b, rerr, content)
			}
			st, serr := os.Lstat(path)
			if serr != nil || !st.Mode().IsRegular() || st.Mode().Perm() != tc.perm {
				t.Errorf("target %v (%v), want a regular file of mode %v", st.Mode(), serr, tc.perm)
			}
		})
	}
}

func file(content string) func(*testing.T, string) string {
	return func(t *testing.T, path string) string {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return content
	}
}

func symlink(to string) func(*testing.T, string) string {
	return func(t *testing.T, path string) string {
		if err := os.Symlink(to, path); err != nil {
			t.Fatal(err)
		}
		return ""
	}
}

func directory(t *testing.T, path string) string {
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path, "inside"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return ""
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestWriteFileRenames: a replaced file is a new file under the old name,
// never the old one rewritten: a reader that opened it before keeps the
// whole old content, and one that opens it after gets the whole new.
func TestWriteFileRenames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := WriteFile(path, []byte("old content"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := WriteFile(path, []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, _ := r.ReadAt(buf, 0)
	if string(buf[:n]) != "old content" {
		t.Errorf("the reader of the old file reads %q, want it whole", buf[:n])
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "new" {
		t.Errorf("the file reads %q (%v)", b, err)
	}
	oldSt, _ := r.Stat()
	newSt, _ := os.Stat(path)
	if os.SameFile(oldSt, newSt) {
		t.Error("the file was rewritten in place")
	}
}

// TestWriteIgnoresUmask: the mode asked for is the file's, whatever the
// umask.
func TestWriteIgnoresUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "manifest.json")
	if err := WriteFile(path, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v (%v), want 0644", st.Mode(), err)
	}
}

// TestSync: a file and a directory are synced by their path; a missing
// path is an error.
func TestSync(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := recordSyncs(t, path, "x", nil)
	for _, p := range []string{path, dir} {
		if err := Sync(p); err != nil {
			t.Errorf("sync %s: %v", p, err)
		}
	}
	if !slices.Equal(s.names, []string{path, dir}) {
		t.Errorf("synced %q", s.names)
	}
	if err := Sync(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("sync of a missing file: %v", err)
	}
}
