package audit

import (
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
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

// TestReopen_NeverReplaces: moving the log onto a name that is taken
// fails and loses nothing. Before, `vmgated audit rotate` twice in one
// second (one name per second) renamed the second file onto the first:
// its history was gone and VerifyFiles of the directory still passed
// (issue 30, finding 5).
func TestReopen_NeverReplaces(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(Options{Path: path, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	writeRecs(t, l, 3)
	to := path + ".20261202T101500Z"
	if _, err := l.Reopen(to); err != nil {
		t.Fatal(err)
	}
	writeRecs(t, l, 2)
	if rotated, err := l.Reopen(to); err == nil || !errors.Is(err, os.ErrExist) || rotated {
		t.Errorf("Reopen onto a taken name: rotated %v, %v; want an error wrapping os.ErrExist", rotated, err)
	}
	// Every record is still there, in one chain, and the log goes on.
	writeRecs(t, l, 1)
	seq, head := l.Head()
	reps, err := VerifyFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 2 || reps[0].FirstSeq != 1 || reps[0].LastSeq != 3 || reps[1].LastSeq != seq || reps[1].Head != head {
		t.Errorf("after a refused rotation: %+v; log head %d %s", reps, seq, head)
	}
}

// TestRotate_SameSecond: rotations within one second get distinct names,
// a name taken by someone else is skipped, and the series keeps every
// record in one chain, each rotate record naming the file before it.
func TestRotate_SameSecond(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(Options{Path: path, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	second := time.Date(2026, 12, 2, 10, 15, 0, 0, time.UTC)
	l.now = func() time.Time { return second }
	base := path + ".20261202T101500Z"
	var moved []string
	for i := range 3 {
		writeRecs(t, l, 2)
		if i == 1 { // someone else's file at the next name
			if err := os.WriteFile(base+".1", []byte("not ours\n"), 0o640); err != nil {
				t.Fatal(err)
			}
		}
		to, err := l.Rotate()
		if err != nil {
			t.Fatal(err)
		}
		moved = append(moved, to)
	}
	if want := []string{base, base + ".2", base + ".3"}; !slices.Equal(moved, want) {
		t.Errorf("moved to %q, want %q", moved, want)
	}
	if b, err := os.ReadFile(base + ".1"); err != nil || string(b) != "not ours\n" {
		t.Errorf("the foreign file: %q, %v", b, err)
	}
	writeRecs(t, l, 1)
	seq, head := l.Head()
	reps, err := VerifyFiles(append(moved, path)...)
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) != 4 || reps[0].FirstSeq != 1 || reps[3].LastSeq != seq || reps[3].Head != head {
		t.Fatalf("reports %+v; log head %d %s", reps, seq, head)
	}
	for i, r := range reps[1:] {
		prev := reps[i]
		want := &Predecessor{File: filepath.Base(prev.Path), LastSeq: prev.LastSeq, Head: prev.Head}
		if r.Predecessor == nil || *r.Predecessor != *want {
			t.Errorf("%s: predecessor %+v, want %+v", r.Path, r.Predecessor, want)
		}
	}
	if reps[0].PredecessorMissing {
		t.Error("the first file of a chain has no predecessor to miss")
	}
}

// TestReopen_NamesMovedFile: after logrotate's move and SIGHUP, the rotate
// record names the file where logrotate put it; after the open file was
// deleted, it names the deleted file, which verify then reports missing.
func TestReopen_NamesMovedFile(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the moved file's name comes from /proc/self/fd")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(Options{Path: path, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	writeRecs(t, l, 2)
	if err := os.Rename(path, path+"-20261202-1764670500"); err != nil {
		t.Fatal(err)
	}
	if rotated, err := l.Reopen(""); err != nil || !rotated {
		t.Fatalf("Reopen: %v %v", rotated, err)
	}
	rep, err := VerifyFile(path)
	if err != nil || rep.Predecessor == nil || rep.Predecessor.File != "audit.jsonl-20261202-1764670500" || rep.Predecessor.LastSeq != 2 {
		t.Fatalf("after logrotate's move: %+v, %v", rep.Predecessor, err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if rotated, err := l.Reopen(""); err != nil || !rotated {
		t.Fatalf("Reopen after a removal: %v %v", rotated, err)
	}
	// The directory holds the moved file and the newest, which continues
	// the deleted one: an error that names it. Verified alone, the newest
	// file reports its predecessor missing.
	if _, err := VerifyFiles(dir); !errors.Is(err, ErrChainBroken) || !strings.Contains(err.Error(), "continues seq 3 (head") ||
		!strings.Contains(err.Error(), " of audit.jsonl, but") {
		t.Errorf("VerifyFiles(dir) after a removal: %v", err)
	}
	if reps, err := VerifyFiles(path); err != nil || !reps[0].PredecessorMissing || reps[0].Predecessor.File != "audit.jsonl" {
		t.Errorf("VerifyFiles(%s) = %+v, %v; want its removed predecessor reported", path, reps, err)
	}
}

// TestVerifyFiles_MissingPredecessor: a rotate record names the file it
// continues; verify over a directory or a single file reports it when it
// is not there, names it when a file in the middle is missing, accepts it
// compressed, and refuses a predecessor that contradicts the chain.
func TestVerifyFiles_MissingPredecessor(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := Open(Options{Path: path, SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	var moved []string
	for range 3 {
		writeRecs(t, l, 2)
		to, err := l.Rotate()
		if err != nil {
			t.Fatal(err)
		}
		moved = append(moved, to)
	}
	writeRecs(t, l, 1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	check := func(name string, reps []FileReport, err error, missing bool) {
		t.Helper()
		if err != nil || len(reps) == 0 || reps[0].PredecessorMissing != missing {
			t.Errorf("%s: %+v, %v; want PredecessorMissing %v on the first", name, reps, err, missing)
		}
	}
	reps, err := VerifyFiles(dir)
	check("whole directory", reps, err, false)
	reps, err = VerifyFiles(path)
	check("newest file, its predecessor beside it", reps, err, false)

	// logrotate's compress: the named file is there as NAME.gz.
	gzipFile(t, moved[2])
	reps, err = VerifyFiles(path)
	check("predecessor compressed", reps, err, false)

	// The oldest file removed (retention, or erasure): reported, not an error.
	if err := os.Remove(moved[0]); err != nil {
		t.Fatal(err)
	}
	reps, err = VerifyFiles(dir)
	check("oldest file removed, directory", reps, err, true)
	if reps[0].Path != moved[1] || reps[0].Predecessor.File != filepath.Base(moved[0]) {
		t.Errorf("first report %+v, want %s naming %s", reps[0], moved[1], filepath.Base(moved[0]))
	}
	reps, err = VerifyFiles(moved[1])
	check("oldest file removed, single file", reps, err, true)

	// A file in the middle removed: an error that names it.
	if err := os.Remove(moved[2] + ".gz"); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyFiles(dir); !errors.Is(err, ErrChainBroken) || !strings.Contains(err.Error(), "of "+filepath.Base(moved[2])+", but") {
		t.Errorf("middle file removed: %v", err)
	}

	// A predecessor that contradicts the record's own seq and prev.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	forged := filepath.Join(t.TempDir(), "audit.jsonl")
	if err := os.WriteFile(forged, bytes.Replace(b, []byte(`"last_seq":8`), []byte(`"last_seq":7`), 1), 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyFiles(forged); !errors.Is(err, ErrChainBroken) || !strings.Contains(err.Error(), "predecessor ends at seq 7") {
		t.Errorf("forged predecessor: %v", err)
	}
}

// TestVerify_OldRotateRecord: a rotate record written before records
// named their predecessor still verifies, alone and in a series.
func TestVerify_OldRotateRecord(t *testing.T) {
	lines, head := validLog(t, 3)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "audit.jsonl.1"), bytes.Join(lines, nil), 0o640); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	first, err := encode(&Record{Time: now, Seq: 4, Kind: KindRotate, Message: "continues the chain of the previous file, which ends at seq 3", Prev: head})
	if err != nil {
		t.Fatal(err)
	}
	second, err := encode(&Record{Time: now, Seq: 5, Kind: KindDaemon, Message: "event", Prev: lineHash(bytes.TrimSuffix(first, []byte("\n")))})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(first, []byte("predecessor")) {
		t.Fatalf("not an old record: %s", first)
	}
	path := filepath.Join(dir, "audit.jsonl")
	if err := os.WriteFile(path, append(first, second...), 0o640); err != nil {
		t.Fatal(err)
	}
	reps, err := VerifyFiles(dir)
	if err != nil || len(reps) != 2 || reps[1].ContinuesSeq != 3 || reps[1].Predecessor != nil {
		t.Errorf("series: %+v, %v", reps, err)
	}
	reps, err = VerifyFiles(path)
	if err != nil || reps[0].PredecessorMissing {
		t.Errorf("alone: %+v, %v", reps, err)
	}
}

// gzipFile replaces path by path.gz, as logrotate's compress does.
func gzipFile(t *testing.T, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(b)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".gz", z.Bytes(), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
}

// TestLinkThenRemove: the fallback of renameNoReplace on file systems
// without RENAME_NOREPLACE refuses a taken name too.
func TestLinkThenRemove(t *testing.T) {
	dir := t.TempDir()
	from, to := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, f := range []string{from, to} {
		if err := os.WriteFile(f, []byte(f), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := linkThenRemove(from, to); !errors.Is(err, os.ErrExist) {
		t.Fatalf("onto a taken name: %v", err)
	}
	if b, _ := os.ReadFile(to); string(b) != to {
		t.Fatalf("the taken name now holds %q", b)
	}
	if err := os.Remove(to); err != nil {
		t.Fatal(err)
	}
	if err := linkThenRemove(from, to); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(to); string(b) != from {
		t.Fatalf("moved file holds %q", b)
	}
	if _, err := os.Lstat(from); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the old name is still there: %v", err)
	}
}

// TestVerifyFiles_GzipBomb: a rotated .gz file that unpacks to a first
// line without end costs the verifier at most a bounded line, however
// far it unpacks: VerifyFiles orders the directory by each file's first
// record, and then verifies each, and both reads stop at MaxLineSize of
// decompressed bytes with an error that names the file and the line.
// Before, ordering read the whole first line: a .gz of 191 KiB made
// audit verify and receipt verify --audit allocate 438 MiB.
func TestVerifyFiles_GzipBomb(t *testing.T) {
	const unpacked = 128 << 20
	dir := t.TempDir()
	l, err := Open(Options{Path: filepath.Join(dir, "audit.jsonl"), SyncInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	writeRecs(t, l, 2)
	l.Close()
	f, err := os.OpenFile(filepath.Join(dir, "audit.jsonl.1.gz"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	zw, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	chunk := bytes.Repeat([]byte("a"), 1<<20)
	for range unpacked / len(chunk) {
		if _, err := zw.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = VerifyFiles(dir)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrChainBroken) || !strings.Contains(err.Error(), "audit.jsonl.1.gz") || !strings.Contains(err.Error(), "line 1: longer than") {
		t.Errorf("err = %v, want the bomb's first line refused as too long", err)
	}
	// Two reads of at most one line each (ordering, then verifying), and
	// the slices a line grows through.
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(6*MaxLineSize); got > limit {
		t.Errorf("allocated %d MiB for a first line of %d MiB, want at most %d MiB", got>>20, unpacked>>20, limit>>20)
	}
}
