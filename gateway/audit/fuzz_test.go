package audit

import (
	"bytes"
	"errors"
	"hash/fnv"
	"log/slog"
	"testing"
)

// FuzzVerify feeds arbitrary bytes to Verify, which must not panic and must
// agree with Open about where a valid log ends; and it writes a fresh log
// whose contents derive from the input, which must verify, and in which any
// flipped byte must be detected (an error, or a head other than the anchor).
func FuzzVerify(f *testing.F) {
	lines, _ := validLog(f, 3)
	valid := bytes.Join(lines, nil)
	f.Add([]byte(""))
	f.Add([]byte("\n"))
	f.Add([]byte("{}\n"))
	f.Add([]byte(`{"time":"2026-01-01T00:00:00Z","seq":1,"kind":"daemon","prev":"` + GenesisPrev + `"}` + "\n"))
	f.Add(valid)
	f.Add(valid[:len(valid)-1])
	f.Add(bytes.Join([][]byte{lines[0], lines[2], lines[1]}, nil))
	f.Add([]byte("password=hunter2\x00argv\x00\xff\xfe"))

	f.Fuzz(func(t *testing.T, data []byte) {
		checkVerify(t, data)
		checkFreshLog(t, data)
	})
}

// checkVerify checks the invariants of Verify on arbitrary input.
func checkVerify(t *testing.T, data []byte) {
	rep, err := Verify(bytes.NewReader(data))
	if len(rep.Head) != len(GenesisPrev) {
		t.Fatalf("head %q", rep.Head)
	}
	if rep.Lines > 0 && (rep.FirstSeq != 1 || rep.LastSeq != uint64(rep.Lines)) {
		t.Fatalf("report %+v: seqs do not match the line count", rep)
	}
	switch {
	case err == nil:
		if rep.BrokenLine != 0 {
			t.Fatalf("no error but BrokenLine %d", rep.BrokenLine)
		}
		// Open resumes exactly where Verify ended.
		l, err := open(Options{Path: "fuzz", Logger: slog.New(slog.DiscardHandler)}, func(string) (file, int64, error) {
			return newMemFile(data), int64(len(data)), nil
		})
		if err != nil {
			t.Fatalf("Verify accepts the log but Open refuses it: %v", err)
		}
		defer l.Close()
		if seq, head := l.Head(); seq != rep.LastSeq || head != rep.Head {
			t.Fatalf("Open resumed at %d %s, Verify ended at %d %s", seq, head, rep.LastSeq, rep.Head)
		}
	case errors.Is(err, ErrChainBroken):
		if rep.BrokenLine != rep.Lines+1 {
			t.Fatalf("BrokenLine %d after %d intact lines: %v", rep.BrokenLine, rep.Lines, err)
		}
	default:
		t.Fatalf("Verify of an in-memory reader: %v", err)
	}
}

// checkFreshLog writes records made from data, verifies them and checks
// that flipping any one byte is detected.
func checkFreshLog(t *testing.T, data []byte) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{SyncInterval: -1, Redact: []string{`^password=`}})
	n := 1 + len(data)%3
	for i := range n {
		r := rec(i)
		r.Argv = append(r.Argv, string(data))
		for a := range bytes.SplitSeq(data, []byte{0}) {
			r.Argv = append(r.Argv, string(a))
		}
		r.Message = string(data)
		if err := l.Write(r); err != nil {
			t.Fatalf("Write: %v", err)
		}
	}
	_, anchor := l.Head()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	log := m.bytes()
	rep, err := Verify(bytes.NewReader(log))
	if err != nil || rep.Lines != n || rep.Head != anchor {
		t.Fatalf("fresh log: %+v, %v\n%s", rep, err, log)
	}

	h := fnv.New64a()
	h.Write(data)
	pos := h.Sum64() % uint64(len(log))
	log[pos] ^= 1 << (len(data) % 8)
	if rep, err := Verify(bytes.NewReader(log)); err == nil && rep.Head == anchor {
		t.Fatalf("flipped byte %d undetected:\n%s", pos, log)
	}
}
