package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestLog_ArgvBytes: an argv element or an environment name that is not
// UTF-8 is recorded as {"b64": …}, which reads back as the exact bytes;
// text elements keep their old form; the chain verifies. Before, the
// record held U+FFFD for each invalid byte, and "\xff" and "\xfe" read
// the same.
func TestLog_ArgvBytes(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{})
	argv := []string{"printf", "%s", "\xff\xfe", "a<b&c", "é", "\ufffd"}
	if err := l.Write(Record{Kind: KindDecision, Verdict: VerdictAllow, Argv: argv, EnvNames: []string{"K\xff", "LANG"}}); err != nil {
		t.Fatal(err)
	}
	line := m.bytes()
	for _, want := range []string{`"argv":["printf","%s",{"b64":"//4="},"a<b&c","é","` + "\ufffd" + `"]`, `"env_names":[{"b64":"S/8="},"LANG"]`} {
		if !bytes.Contains(line, []byte(want)) {
			t.Errorf("line lacks %s: %s", want, line)
		}
	}
	r, err := parseLine(bytes.TrimSuffix(line, []byte("\n")))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(r.Argv, argv) || !slices.Equal(r.EnvNames, []string{"K\xff", "LANG"}) {
		t.Errorf("read back argv %q env names %q", r.Argv, r.EnvNames)
	}
	if _, err := Verify(bytes.NewReader(line)); err != nil {
		t.Fatal(err)
	}
}

// TestLog_ArgvBytesBounded: a long element that is not UTF-8 is abridged
// as text ever was, its mark holding the hash of its full bytes, and
// the record stays small.
func TestLog_ArgvBytesBounded(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{})
	long := strings.Repeat("\xff", 4*MaxFieldBytes)
	many := make([]string, 2*MaxArgs)
	for i := range many {
		many[i] = strings.Repeat("\x80", 100)
	}
	for _, argv := range [][]string{{"x", long}, many} {
		if err := l.Write(Record{Kind: KindDecision, Verdict: VerdictDeny, Argv: argv}); err != nil {
			t.Fatal(err)
		}
	}
	lines := bytes.SplitAfter(m.bytes(), []byte("\n"))
	sum := sha256.Sum256([]byte(long))
	if !bytes.Contains(lines[0], []byte(hex.EncodeToString(sum[:]))) || len(lines[0]) > 8<<10 {
		t.Errorf("long element: %d bytes, hash of the full bytes there: %v", len(lines[0]), bytes.Contains(lines[0], []byte(hex.EncodeToString(sum[:]))))
	}
	if len(lines[1]) > 64<<10 || !bytes.Contains(lines[1], []byte("more arguments")) {
		t.Errorf("many elements: %d bytes", len(lines[1]))
	}
	if _, err := Verify(bytes.NewReader(m.bytes())); err != nil {
		t.Fatal(err)
	}
}

// TestLog_RedactsBytes: a redacted argument that is not UTF-8 is kept out
// of the record, and out of a reason that quotes it as the policy does
// (strconv.Quote: \xff).
func TestLog_RedactsBytes(t *testing.T) {
	m := newMemFile(nil)
	l := openMem(t, m, Options{Redact: []string{`^--password=`}})
	secret := "--password=\xffhunter2"
	if err := l.Write(Record{Kind: KindDecision, Verdict: VerdictDeny, Argv: []string{"mysql", secret},
		Reason: "argument 1 " + strconv.Quote(secret) + ` matches "--password=*"`}); err != nil {
		t.Fatal(err)
	}
	data := m.bytes()
	if bytes.Contains(data, []byte("hunter2")) {
		t.Errorf("the secret reached the file: %s", data)
	}
	r, err := parseLine(bytes.TrimSuffix(data, []byte("\n")))
	if err != nil || !slices.Equal(r.Argv, []string{"mysql", Redacted}) {
		t.Errorf("argv %q, %v", r.Argv, err)
	}
}
