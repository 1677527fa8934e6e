package audit

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// validLog returns a freshly written log of n records, split into lines
// with their newlines, and its head.
func validLog(t testing.TB, n int) ([][]byte, string) {
	t.Helper()
	m := newMemFile(nil)
	l := openMem(t, m, Options{})
	writeN(t, l, 1, n)
	_, head := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return bytes.SplitAfter(m.bytes(), []byte("\n"))[:n], head
}

// forged returns a well-formed line with the given seq that chains to prev.
func forged(t testing.TB, seq uint64, prev []byte) []byte {
	t.Helper()
	line, err := encode(&Record{Time: time.Now().UTC(), Seq: seq, Kind: KindDecision, Verdict: VerdictAllow,
		Argv: []string{"rm", "-rf", "/"}, Prev: lineHash(bytes.TrimSuffix(prev, []byte("\n")))})
	if err != nil {
		t.Fatal(err)
	}
	return line
}

func TestVerify_Tamper(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(t *testing.T, lines [][]byte) [][]byte
		line   int    // first broken line reported
		want   string // in the error
		torn   bool
	}{
		{
			name: "edit a field in the middle line",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				l[2] = bytes.Replace(l[2], []byte(`"uid":1000`), []byte(`"uid":0`), 1)
				return l
			},
			line: 4, want: "prev mismatch",
		},
		{
			name: "edit the middle line so it no longer parses",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				l[2] = bytes.Replace(l[2], []byte(`"uid":1000`), []byte(`"uid":-1`), 1)
				return l
			},
			line: 3, want: "not a record",
		},
		{
			name:   "delete the middle line",
			tamper: func(t *testing.T, l [][]byte) [][]byte { return slices.Delete(l, 2, 3) },
			line:   3, want: "seq 4, want 3",
		},
		{
			name:   "delete the first line",
			tamper: func(t *testing.T, l [][]byte) [][]byte { return l[1:] },
			line:   1, want: "seq 2, want 1",
		},
		{
			name: "swap two lines",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				l[1], l[2] = l[2], l[1]
				return l
			},
			line: 2, want: "seq 3, want 2",
		},
		{
			name: "remove the last newline",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				l[4] = bytes.TrimSuffix(l[4], []byte("\n"))
				return l
			},
			line: 5, want: "without newline", torn: true,
		},
		{
			name: "insert a forged line with recomputed prev and a wrong seq",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				return slices.Insert(l, 2, forged(t, 99, l[1]))
			},
			line: 3, want: "seq 99, want 3",
		},
		{
			name: "insert a forged line with recomputed prev and the next seq",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				return slices.Insert(l, 2, forged(t, 3, l[1]))
			},
			line: 4, want: "seq 3, want 4",
		},
		{
			name: "forged first line",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				f := forged(t, 1, []byte("x"))
				return append([][]byte{f}, l[1:]...)
			},
			line: 1, want: "want the genesis value",
		},
		{
			name: "insert an empty line",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				return slices.Insert(l, 3, []byte("\n"))
			},
			line: 4, want: "empty line",
		},
		{
			name: "append garbage",
			tamper: func(t *testing.T, l [][]byte) [][]byte {
				return append(l, []byte("{}\n"))
			},
			line: 6, want: "record has no time",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lines, _ := validLog(t, 5)
			data := bytes.Join(tt.tamper(t, lines), nil)
			rep, err := Verify(bytes.NewReader(data))
			if !errors.Is(err, ErrChainBroken) {
				t.Fatalf("Verify = %v, want ErrChainBroken", err)
			}
			if errors.Is(err, ErrTornLine) != tt.torn {
				t.Errorf("errors.Is(ErrTornLine) = %v, want %v", !tt.torn, tt.torn)
			}
			if rep.BrokenLine != tt.line || rep.Lines != tt.line-1 {
				t.Errorf("BrokenLine %d, Lines %d; want %d, %d (%v)", rep.BrokenLine, rep.Lines, tt.line, tt.line-1, err)
			}
			prefix := "audit chain broken: "
			if tt.torn {
				prefix += "torn final line: "
			}
			if !strings.HasPrefix(err.Error(), prefix+"line "+strconv.Itoa(tt.line)+": ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q, want %q…line %d…%q", err, prefix, tt.line, tt.want)
			}
		})
	}
}

// TestVerify_Limits pins down what the chain alone cannot see: an edit of
// the last line and the loss of the tail. Both show as a head that differs
// from an anchor taken with Log.Head.
func TestVerify_Limits(t *testing.T) {
	lines, anchor := validLog(t, 5)

	rep, err := Verify(bytes.NewReader(bytes.Join(lines, nil)))
	if err != nil || rep.Head != anchor || rep.Lines != 5 || rep.FirstSeq != 1 || rep.LastSeq != 5 {
		t.Fatalf("intact log: %+v, %v", rep, err)
	}

	edited := slices.Clone(lines)
	edited[4] = bytes.Replace(edited[4], []byte("record 5"), []byte("record 6"), 1)
	rep, err = Verify(bytes.NewReader(bytes.Join(edited, nil)))
	if err != nil || rep.Head == anchor {
		t.Errorf("edited last line: %+v, %v; want a valid chain with a different head", rep, err)
	}

	rep, err = Verify(bytes.NewReader(bytes.Join(lines[:3], nil)))
	if err != nil || rep.Lines != 3 || rep.Head == anchor {
		t.Errorf("truncated tail: %+v, %v; want 3 valid lines and a different head", rep, err)
	}
}

func TestVerify_Empty(t *testing.T) {
	rep, err := Verify(strings.NewReader(""))
	if err != nil || !reflect.DeepEqual(rep, Report{Head: GenesisPrev}) {
		t.Fatalf("Verify(empty) = %+v, %v", rep, err)
	}
}

func TestVerify_LineTooLong(t *testing.T) {
	lines, _ := validLog(t, 1)
	data := append(lines[0], bytes.Repeat([]byte("a"), MaxLineSize+1)...)
	rep, err := Verify(bytes.NewReader(data))
	if !errors.Is(err, ErrChainBroken) || rep.BrokenLine != 2 || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("Verify = %+v, %v", rep, err)
	}
}

func TestVerify_ReadError(t *testing.T) {
	lines, _ := validLog(t, 2)
	r := &failingReader{data: bytes.Join(lines, nil)}
	rep, err := Verify(r)
	if !errors.Is(err, errRead) || errors.Is(err, ErrChainBroken) || rep.Lines != 2 {
		t.Fatalf("Verify = %+v, %v; want the read error after 2 lines", rep, err)
	}
}

var errRead = errors.New("disk on fire")

type failingReader struct{ data []byte }

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, errRead
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestVerifyFile(t *testing.T) {
	dir := t.TempDir()
	if _, err := VerifyFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	lines, _ := validLog(t, 3)
	path := filepath.Join(dir, "audit.jsonl")
	if err := os.WriteFile(path, bytes.Join(slices.Delete(lines, 1, 2), nil), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err := VerifyFile(path)
	if want := "audit verify " + path + ": audit chain broken: line 2: seq 3, want 2"; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("VerifyFile = %v, want %q…", err, want)
	}
}

// TestVerify_OlderRecords: a log written before a field existed (here an
// exec record without disk_bytes, as vmgated wrote it until the disk
// limit) still verifies, and reads with the field unset; a record with it
// follows on the same chain.
func TestVerify_OlderRecords(t *testing.T) {
	old := []byte(`{"time":"2026-11-30T10:00:00.5Z","seq":1,"kind":"exec","request_id":"r1","uid":1000,"profile":"default",` +
		`"argv":["dd","if=/dev/zero","of=/root/big"],"vm_id":"0f2755902be5","exit_code":1,"duration_ms":12000,"boot_ms":83,"vm_start":"pool",` +
		`"prev":"` + GenesisPrev + `"}`)
	r, err := parseLine(old)
	if err != nil || r.DiskBytes != 0 || r.VMStart != "pool" {
		t.Fatalf("old record: %+v, %v", r, err)
	}
	next, err := encode(&Record{Time: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC), Seq: 2, Kind: KindExec, DiskBytes: 70 << 20, Prev: lineHash(old)})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(next, []byte(`"disk_bytes":73400320`)) {
		t.Errorf("new record: %s", next)
	}
	rep, err := Verify(bytes.NewReader(append(append(old, '\n'), next...)))
	if err != nil || rep.Lines != 2 {
		t.Fatalf("Verify = %+v, %v", rep, err)
	}
}
