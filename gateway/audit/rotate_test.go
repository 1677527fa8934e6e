package audit

import (
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeRecs(t *testing.T, l *Log, n int) {
	t.Helper()
	for range n {
		if err := l.Write(Record{Kind: KindDaemon, Message: "event"}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRotation: a file moved away (logrotate) or moved by Reopen itself
// is followed by a new file that continues the chain; VerifyFiles checks
// the series and names a missing, reordered or changed file.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(Options{Path: path, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	writeRecs(t, l, 3)
	if rotated, err := l.Reopen(""); err != nil || rotated {
		t.Fatalf("Reopen of an unmoved file: %v %v", rotated, err)
	}
	// logrotate: move, then signal.
	if err := os.Rename(path, path+".2"); err != nil {
		t.Fatal(err)
	}
	if rotated, err := l.Reopen(""); err != nil || !rotated {
		t.Fatalf("Reopen after a move: %v %v", rotated, err)
	}
	writeRecs(t, l, 2)
	// vmgated audit rotate: Reopen moves it itself.
	if rotated, err := l.Reopen(path + ".3"); err != nil || !rotated {
		t.Fatalf("Reopen with moveTo: %v %v", rotated, err)
	}
	writeRecs(t, l, 1)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	seq, head := l.Head()

	reps, err := VerifyFiles(path+".2", path+".3", path)
	if err != nil {
		t.Fatal(err)
	}
	if last := reps[len(reps)-1]; last.LastSeq != seq || last.Head != head || reps[1].ContinuesSeq != 3 || reps[1].FirstSeq != 4 {
		t.Errorf("reports %+v; log head %d %s", reps, seq, head)
	}
	// A directory: its files in chain order, whatever their names.
	if reps, err := VerifyFiles(dir); err != nil || len(reps) != 3 || reps[0].Path != path+".2" {
		t.Errorf("VerifyFiles(dir): %+v %v", reps, err)
	}
	// A single continuing file verifies alone.
	if rep, err := VerifyFile(path); err != nil || rep.ContinuesSeq != 6 {
		t.Errorf("VerifyFile of the newest: %+v %v", rep, err)
	}
	for _, tc := range []struct {
		files []string
		want  string
	}{
		{[]string{path + ".2", path}, "a file is missing between them"},
		{[]string{path + ".3", path + ".2", path}, "starts a new chain"},
	} {
		if _, err := VerifyFiles(tc.files...); err == nil || !errors.Is(err, ErrChainBroken) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("VerifyFiles(%v): %v, want %q", tc.files, err, tc.want)
		}
	}
	// logrotate's compress: a .gz file verifies as well.
	b, _ := os.ReadFile(path + ".2")
	gz := filepath.Join(t.TempDir(), "audit.jsonl.2.gz")
	f, _ := os.Create(gz)
	zw := gzip.NewWriter(f)
	_, _ = zw.Write(b)
	_ = zw.Close()
	_ = f.Close()
	if _, err := VerifyFiles(gz, path+".3", path); err != nil {
		t.Errorf("with a compressed file: %v", err)
	}
	// Another file at the path is not appended to.
	if err := os.Rename(path, path+".4"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("someone else's\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Reopen(""); err == nil || !strings.Contains(err.Error(), "another file") {
		t.Errorf("Reopen onto a foreign file: %v", err)
	}
}
