package gateway_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vmgate/vmgate/gateway/audit"
	"github.com/vmgate/vmgate/gateway/gatewaytest"
	"github.com/vmgate/vmgate/internal/testutil"
	"github.com/vmgate/vmgate/vm"
)

// checkPrivate checks that everything under dir belongs to the daemon's
// user and to no one else: directories 0700, files 0600 (a save point's
// savepoint.json 0400), nothing else. It returns how many entries it
// checked.
func checkPrivate(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		switch {
		case fi.IsDir():
			want = fs.ModeDir | 0o700
		case e.Name() == vm.SavePointMetaFile:
			want = 0o400
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
			t.Errorf("%s: not owned by the daemon's uid %d: %+v", p, os.Getuid(), fi.Sys())
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sessionRecords are the audit log's session records of the session
// whose message starts with prefix.
func sessionRecords(t *testing.T, path, session, prefix string) []audit.Record {
	t.Helper()
	var out []audit.Record
	for _, r := range testutil.JSONLines[audit.Record](t, path) {
		if r.Kind == audit.KindSession && r.Session == session && strings.HasPrefix(r.Message, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// readDirNames lists a directory's entries; none when it does not exist.
func readDirNames(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// setPolicy rewrites the daemon's policy file and reloads it, as SIGHUP
// does.
func setPolicy(t *testing.T, d *gatewaytest.Daemon, policy string) {
	t.Helper()
	if err := os.WriteFile(d.Config.PolicyPath, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	d.Reload()
}

// metricValue reads one sample without labels from the metrics' text.
func metricValue(t *testing.T, text, name string) float64 {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("no metric %s in:\n%s", name, text)
	return 0
}

// sessionDirOf is the directory, under state, of the session named name.
func sessionDirOf(t *testing.T, state, name string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(state, "sessions", "*", "session.json"))
	for _, f := range files {
		var s struct{ Name string }
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &s) == nil && s.Name == name {
			return filepath.Dir(f)
		}
	}
	t.Fatalf("no session %q under %s", name, state)
	return ""
}

// restamp sets one field of the paused session's save point record, as
// another machine (an upgraded image, another QEMU) would have written
// it.
func restamp(t *testing.T, state, name, field string, value any) {
	t.Helper()
	dir := sessionDirOf(t, state, name)
	var s struct {
		SavePoint string `json:"save_point"`
	}
	if err := json.Unmarshal([]byte(testutil.ReadFile(t, filepath.Join(dir, "session.json"))), &s); err != nil || s.SavePoint == "" {
		t.Fatalf("session %q is not paused: %v", name, err)
	}
	p := filepath.Join(dir, s.SavePoint, vm.SavePointMetaFile)
	m := map[string]any{}
	if err := json.Unmarshal([]byte(testutil.ReadFile(t, p)), &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m[field]; !ok {
		t.Fatalf("%s has no field %q", p, field)
	}
	m[field] = value
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o400); err != nil {
		t.Fatal(err)
	}
}
